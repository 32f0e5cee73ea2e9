"""The `quantlab` command line (`quantlab.cli:app`): cli/base.py holds the app, its
exit codes and progress; each *_commands module adds its commands to it."""

# importing a commands module registers its commands, in this order in --help
from quantlab.cli import run_commands  # noqa: F401, I001
from quantlab.cli import decide_commands  # noqa: F401, I001
from quantlab.cli import calibrate_commands  # noqa: F401, I001
from quantlab.cli import release_commands  # noqa: F401, I001
from quantlab.cli import recipe_commands  # noqa: F401, I001
from quantlab.cli.base import app

__all__ = ["app"]
