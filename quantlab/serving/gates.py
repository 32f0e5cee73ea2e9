"""The serve check's gate (pure): the kernels that ran are the ones the scheme should get.

`kernel_path` compares what the candidate engine's log names (the linear kernel per
quantized layer type, the weight-only FP8 fallback warning, the KV-cache dtype and the
attention backend) with the expectation the plan made for that host (serving/kernels.py,
recorded in the compat record) and with what the recipe asked for (engine_args
kv_cache_dtype and attention_backend); `verdicts` turns that record into the
`serve.kernel_path@<target>` gate. A kernel named in serve.allow_kernels is accepted; where
the recipe chose the linear kernels itself (engine_args linear_backend, env
VLLM_DISABLED_KERNELS) they are recorded, not gated.
"""

from __future__ import annotations

from typing import Any

from quantlab.core.verdicts import GateVerdict
from quantlab.serving.kernels import recipe_kernel_choice

CHECK = "serve"
GATE = "kernel_path"
GATED = ("pass", "fail", "inconclusive")  # a record with one of these statuses is a verdict
# the warning vLLM logs when a W8A8 FP8 checkpoint runs as weight-only FP8 on Marlin (no kernel line)
FP8_FALLBACK = ("weight-only FP8 (the log's 'no native support for FP8 computation' warning)",
                "MarlinFP8ScaledMMLinearKernel")


def registered(recipe: Any) -> dict[str, Any]:
    """The serve check's section as registered before any engine (release/registration.py):
    what its gate reads of the recipe."""
    return {"allow_kernels": recipe.serve.allow_kernels}


def _kernels(log: dict[str, Any]) -> dict[str, list[str]]:
    actual = {layer: list(ks) for layer, ks in (log.get("linear_kernels") or {}).items()}
    if any(w.get("kind") == "fp8_weight_only_fallback" for w in log.get("warnings") or []):
        actual.setdefault(FP8_FALLBACK[0], [FP8_FALLBACK[1]])
    return actual


def _asked(engine_args: dict[str, Any] | None,
           env: dict[str, str] | None) -> tuple[str | None, str | None, str | None]:
    """The KV-cache dtype (fp8 only: the one vLLM can fall back from) and attention backend the
    recipe asks for, and its choice of linear kernels (linear_backend, VLLM_DISABLED_KERNELS,
    VLLM_BATCH_INVARIANT)."""
    args = engine_args or {}
    kv = args.get("kv_cache_dtype")
    attention = args.get("attention_backend") or (env or {}).get("VLLM_ATTENTION_BACKEND")
    return ((str(kv) if kv and str(kv).startswith("fp8") else None), (str(attention) if attention else None),
            recipe_kernel_choice(engine_args, env))


def kernel_path(expectation: dict[str, Any] | None, log: dict[str, Any] | None, *, mode: str,
                allow: list[str], engine_args: dict[str, Any] | None,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """The candidate's kernel path on one serve target: expected, actual, and `status`:
    pass / fail / inconclusive (gated), `not gated` (recorded: the expectation is unknown)
    or `not measured` (no engine log)."""
    exp = expectation or {}
    record: dict[str, Any] = {"expected": exp.get("kernels", []), "host": exp.get("host"), "allowed": list(allow),
                              "actual": None}
    if log is None:
        return {**record, "status": "not measured", "why": "no engine log: quantlab did not start this server "
                "(mode endpoint), so which kernels ran is not known"}
    actual = _kernels(log)
    record["actual"] = actual
    kv_asked, attention_asked, chosen = _asked(engine_args, env)
    if chosen and expectation:  # a deliberate choice is the recipe's, not a fallback: recorded, not gated
        exp = {**exp, "known": False, "why": f"the recipe chose the linear kernels: {chosen}"}
    record["kv_cache_dtype"] = {"expected": kv_asked, "actual": log.get("kv_cache_dtype")}
    record["attention_backend"] = {"expected": attention_asked, "actual": log.get("attention_backend")}
    if mode != "launch":
        return {**record, "status": "not gated", "why": "started by serve.command (a container, a cluster job): "
                "the host and engine build behind it are not the ones quantlab probed, so no expectation is judged"}
    problems, unseen, passed = [], [], []
    ok = set(record["expected"]) | set(allow)
    if exp.get("known"):
        _judge_linear(actual, ok, record["expected"], allow, problems, unseen, passed)
    if kv_asked:
        _judge_kv_cache(record["kv_cache_dtype"]["actual"], kv_asked, problems, unseen, passed)
    _judge_attention(record["attention_backend"]["actual"], attention_asked, problems, passed)
    if not (problems or unseen or passed):
        why = exp.get("why") if expectation else "unquantized candidate: no quantized linear layer to expect " \
            "a kernel for"
        return {**record, "status": "not gated", "why": why or "nothing was expected"}
    status = "fail" if problems else "inconclusive" if unseen else "pass"
    notes = [] if exp.get("known") or not expectation else [f"linear kernels not gated ({exp.get('why')})"]
    return {**record, "status": status, "off_path": len(problems), "why": "; ".join(problems + unseen + passed + notes)}


def _judge_linear(actual: dict[str, list[str]], ok: set[str], expected: list[str], allow: list[str],
                  problems: list[str], unseen: list[str], passed: list[str]) -> None:
    """Add the linear kernels' finding: one off the `ok` (expected or allowed) ones, none named, or as expected."""
    off = {layer: [k for k in ks if k not in ok] for layer, ks in actual.items()}
    off = {layer: ks for layer, ks in off.items() if ks}
    if off:
        problems.append("; ".join(f"{layer} ran {', '.join(ks)}" for layer, ks in off.items())
                        + f" (expected {' or '.join(expected)}"
                        + (f", allowed {', '.join(allow)}" if allow else "") + ")")
    elif not actual:
        unseen.append("the log named no linear kernel")
    else:
        passed.append("; ".join(f"{layer} ran {', '.join(ks)}" for layer, ks in actual.items())
                      + f" (expected {' or '.join(expected)})")


def _judge_kv_cache(actual: str | None, asked: str, problems: list[str], unseen: list[str],
                    passed: list[str]) -> None:
    """Add the KV-cache dtype's finding against the one the recipe asked for."""
    if actual is None:
        unseen.append(f"the log did not name the KV-cache dtype (asked {asked})")
    elif actual == asked or (asked == "fp8" and actual.startswith("fp8")):
        passed.append(f"KV cache {actual} as asked")
    else:
        problems.append(f"KV cache {actual}, asked {asked}")


def _judge_attention(actual: str | None, asked: str | None, problems: list[str], passed: list[str]) -> None:
    """Add the attention backend's finding, when the recipe asked for one and the log named one."""
    if asked and actual is not None:
        (passed if actual == asked else problems).append(
            f"attention {actual}" + (" as asked" if actual == asked else f", asked {asked}"))


def verdicts(record: dict[str, Any] | None, *, scope: str, target: str | None = None) -> list[GateVerdict]:
    """`serve.kernel_path@<scope>`: one verdict when the record was judged, none otherwise
    (not gated, not measured, or no candidate served there)."""
    if not record or record.get("status") not in GATED:
        return []
    status = record["status"]
    host = record.get("host") or "this host"
    return [GateVerdict(check=CHECK, gate=GATE, scope=scope, target=target, verdict=status,
                        value=None if status == "inconclusive" else float(record.get("off_path", 0)), limit=0,
                        metric="kernel choices off the expected path", comparator="at_most", test="threshold",
                        evidence=f"candidate on {host}: {record['why']}")]
