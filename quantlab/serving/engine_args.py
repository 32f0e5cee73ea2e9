"""serve.engine_args resolved as vLLM's own parser reads them, before any server starts.

The api_server's parser is argparse with allow_abbrev: `--hos 0.0.0.0` is `--host 0.0.0.0`.
So each recipe key is resolved against the option table the serving environment's probe
dumped from that parser (serving/vllm_probe.py, cached with the probe: no vLLM import per
run) by argparse's own rule: an exact option string, else the options it is a prefix of;
one is that option, several are ambiguous (argparse refuses them too). Refused, naming the
field and what to use instead: an option quantlab sets itself (recipe/serve.QUANTLAB_OPTIONS:
host, port, api key, trust_remote_code, served name, config, model), an abbreviation
(quantlab reads some keys by their name, dtype and max_model_len among them, so the recipe
must spell them as vLLM names them), an ambiguous prefix and an unknown option.
"""

from __future__ import annotations

from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.recipe.serve import QUANTLAB_OPTIONS, option_of

# dests of the options in QUANTLAB_OPTIONS, as the parser names them
QUANTLAB_DESTS = {"host", "port", "api_key", "trust_remote_code", "served_model_name", "config", "model"}


def resolve(key: str, options: dict[str, str], *, allow_abbrev: bool = True) -> tuple[list[str], list[str]]:
    """(the option strings `key` matches, their dests) by argparse's prefix rule: the exact
    option if there is one, else every option the key is a prefix of."""
    flag = option_of(key)
    if flag in options:
        return [flag], [options[flag]]
    if not allow_abbrev:
        return [], []
    matches = sorted(o for o in options if o.startswith("--") and o.startswith(flag))
    return matches, sorted({options[o] for o in matches})


def _quantlab_field(dest: str) -> str:
    option = "--" + dest.replace("_", "-")
    return QUANTLAB_OPTIONS.get(option, "the serve section's own fields")


def check_engine_args(args: dict[str, Any], table: dict[str, Any] | None, *, engine: str,
                      field: str = "serve.engine_args") -> None:
    """RecipeError for the first key vLLM's parser would read as an option quantlab sets,
    as an abbreviation, ambiguously, or not at all. `table`: the probe's engine_options
    ({"options": {option string: dest}}); None or an error there: only the schema's check
    (recipe/serve.check_engine_arg_keys) has run."""
    options = (table or {}).get("options")
    if not options:
        return
    seen: dict[str, str] = {}
    for key in args:
        flag = option_of(key)
        matches, dests = resolve(key, options, allow_abbrev=(table or {}).get("allow_abbrev", True))
        at = f"{field}.{key}"
        refused = sorted(set(dests) & QUANTLAB_DESTS)
        if refused:
            said = f"is {matches[0]}" if matches == [flag] else \
                f"would be read as {matches[0]}" if len(matches) == 1 else f"is a prefix of {', '.join(matches)}"
            raise RecipeError(f"{flag} {said} by {engine}'s parser, an option quantlab sets itself; use "
                              f"{_quantlab_field(refused[0])}", field=at)
        if not matches:
            short = "-" + key.split(".", 1)[0].replace("_", "-")
            hint = (f"; {short} is {engine}'s short form of --{options[short].replace('_', '-')}: write "
                    f"{options[short]}" if short in options else "")
            raise RecipeError(f"{engine}'s api_server has no option {flag}{hint}. Write an option of `vllm serve "
                              "--help=all` without its leading dashes", field=at)
        if len(matches) > 1:
            raise RecipeError(f"{flag} is ambiguous to {engine}'s parser: it could be {', '.join(matches)}. Write "
                              "the option in full", field=at)
        if matches != [flag]:
            full = matches[0].removeprefix("--").replace("-", "_")
            raise RecipeError(f"{flag} abbreviates {matches[0]}: write it in full ({full}), as quantlab reads some "
                              "engine arguments by their names", field=at)
        head = key.split(".", 1)[0]
        if dests[0] in seen and seen[dests[0]] != head:
            raise RecipeError(f"{field}.{seen[dests[0]]} and {at} are both {flag}: keep one", field=at)
        seen[dests[0]] = head


def engine_label(probe: dict[str, Any]) -> str:
    version = (probe.get("versions") or {}).get("vllm")
    return f"vLLM {version}" if version else "vLLM"
