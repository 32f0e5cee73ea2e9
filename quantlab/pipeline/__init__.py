"""The orchestration: the run loop over the stages, the CLI's other commands, several
candidates against one baseline, and the search's rounds. Only `quantlab.cli` imports it."""
