"""A search's Markdown (reports/search_report.py) from its result as search.json holds it:
the scheme table (a refused scheme last), the layer and knob tables, the choice or the
closest trial, and the notes."""

from __future__ import annotations

import copy

from quantlab.reports.search_report import markdown, plot

SCHEMES = [
    {"source": "gptq-w4a16", "scheme": "W4A16 g128", "predicted_bytes": 61_000_000, "weights_bytes": 60_500_000,
     "predicted_time_ratio": 0.42, "decision": "blocked", "failed_gates": ["quality.min_recovery@arc", "a", "b", "c",
                                                                          "d"],
     "not_shown_gates": [], "output_tokens_per_s": 88.123, "throughput_ratio": 1.5, "run": "runs/x/gptq"},
    {"source": "smoothquant-gptq-w8a8", "scheme": "W8A8 int8", "predicted_bytes": 120_000_000,
     "weights_bytes": None, "predicted_time_ratio": None, "decision": "release", "failed_gates": [],
     "not_shown_gates": [], "output_tokens_per_s": None},
]
RESULT = {
    "recipe": "tiny", "stopped": "found by a scheme", "scheme_trials": SCHEMES, "trials": [], "rounds": [{}, {}],
    "wall_s": 12.4, "width": 2, "kernel_bench": {"ordered_by": "time", "rule": "cost_per_success", "measured": True},
    "scheme_refused": [{"source": "fp8", "why": "no FP8 kernel on this host"}], "chosen_scheme":
        "smoothquant-gptq-w8a8", "recipe_file": "runs/search/x/recipe.yaml", "passed": True, "best": None,
    "settings": {}, "notes": ["a note"], "knob_trials": [], "ranking": None,
}
LAYERS = {
    "recipe": "tiny", "stopped": "found", "scheme_trials": [], "rounds": [{}], "wall_s": 3.0, "width": 2,
    "ranking": "runs/search/x/ranking.json", "granularity": "layer", "max_layers": 4, "best": 1, "passed": True,
    "kept": ["model.layers.0"], "settings": {"quantization.group_size": 128}, "recipe_file": "r.yaml",
    "notes": [], "trials": [
        {"k": 0, "decision": "blocked", "failed_gates": ["quality.min_recovery@arc"], "worst_recovery": 0.81234,
         "weights_bytes": 50_000_000, "output_tokens_per_s": 90.0},
        {"k": 1, "decision": "release", "failed_gates": [], "worst_recovery": None, "weights_bytes": None,
         "output_tokens_per_s": None}],
    "knob_trials": [{"knob": "quantization.group_size", "value": 128, "decision": "release", "failed_gates": [],
                     "worst_recovery": 0.97}],
}


def test_a_scheme_search_reads_as_its_table_the_refused_last_and_the_choice():
    assert markdown(RESULT).splitlines() == [
        "# Search: tiny", "",
        "Stopped: found by a scheme, after 2 trials in 2 rounds, 12 s; 2 trials a round.", "",
        "Schemes, cheapest first by predicted time (selection.rule cost_per_success; the order registered before "
        "the first trial). Predicted speed: one decoder layer's linear time in the scheme's kernel over the 16-bit "
        "layer's, at a decode step, measured on this host; beside it what the served trial measured.", "",
        "| trial | scheme | predicted MB | weights MB | predicted time x | decision | failed gates | out tok/s | "
        "x baseline |", "|---|---|---|---|---|---|---|---|---|",
        "| gptq-w4a16 | W4A16 g128 | 61.0 | 60.5 | 0.42 | blocked | quality.min_recovery@arc, a, b, c (+1) | 88.1 | "
        "1.50 |",
        "| smoothquant-gptq-w8a8 (chosen) | W8A8 int8 | 120.0 | - | - | release | - | - | - |",
        "| fp8 | - | - | - | - | refused (no trial used) | no FP8 kernel on this host | - | - |", "", "",
        "Chosen: the scheme of smoothquant-gptq-w8a8; recipe: runs/search/x/recipe.yaml", "- a note"]


def test_no_scheme_passed_names_the_closest_with_its_gates():
    result = copy.deepcopy(RESULT)
    result.update(chosen_scheme=None, passed=False, kernel_bench={"measured": False, "why": "no kernel"})
    result["scheme_trials"][1].update(decision="not_shown", not_shown_gates=["performance.max_p99_ttft_ms@short"])
    md = markdown(result)
    assert "(selection.rule -;" in md and "measured on this host (not measured: no kernel); beside" in md
    assert md.splitlines()[-2] == (
        "No trial passed. Closest scheme: smoothquant-gptq-w8a8 (W8A8 int8), no gate failed; not shown: "
        "performance.max_p99_ttft_ms@short (each gate's evidence: the report under its run folder)")


def test_a_layer_search_reads_as_its_layer_and_knob_tables(tmp_path):
    lines = markdown(LAYERS).splitlines()
    assert lines[4:] == [
        "Kept layer groups unquantized, most sensitive first (layer ranking runs/search/x/ranking.json); up to 4.",
        "", "| kept | decision | failed gates | worst recovery | weights MB | out tok/s |", "|---|---|---|---|---|---|",
        "| 0 | blocked | quality.min_recovery@arc | 0.812 | 50.0 | 90 |", "| 1 (chosen) | release | - | - | - | - |",
        "", "Knobs, each choice in the order given (the layer trials above start from the settings kept):", "",
        "| knob | value | decision | failed gates | worst recovery |", "|---|---|---|---|---|",
        "| quantization.group_size | 128 | release | - | 0.97 |", "",
        "Chosen: keep 1 (model.layers.0) with {'quantization.group_size': 128}; recipe: r.yaml"]
    failed = {**LAYERS, "passed": False}
    assert markdown(failed).splitlines()[-1] == ("No trial passed. Closest: keep 1, stopped by ")


def test_the_plot_is_drawn_beside_the_markdown_and_a_failure_is_said_not_raised(tmp_path):
    said = []
    plot(LAYERS, tmp_path, said.append)
    assert said == [] and (tmp_path / "search.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "file").write_text("")
    plot(LAYERS, tmp_path / "file", said.append)  # a file where the folder should be
    assert len(said) == 1 and said[0].startswith("the search plot could not be drawn: ")
