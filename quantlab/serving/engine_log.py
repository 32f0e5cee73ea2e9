"""Facts vLLM only tells in its log: kernels, attention backend, KV cache, fallbacks.

Pure functions over log text, tested on real log lines. vLLM's log wording changes
between versions, so nothing here raises: what is not found is reported as missing
(and flagged where it was expected), never guessed.
"""

from __future__ import annotations

import re
from typing import Any

# "Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8"
# "Using CPUWNA16LinearKernel for CompressedTensorsWNA16"
# "Using MarlinLinearKernel for mixed-precision linear"
KERNEL = re.compile(r"\b(?:Selected|Using) ([A-Za-z0-9_]*Kernel[A-Za-z0-9_]*) for ([A-Za-z0-9_ -]+?)\.?\s*$")
# CUDA: "Using FLASH_ATTN attention backend out of potential backends: [...]" or "Using FLASH_ATTN backend."
ATTENTION = re.compile(r"\bUsing ([A-Z][A-Z0-9_]+) (?:attention )?backend\b")
KV_DTYPE = re.compile(r"\bUsing (\w+) data type to store kv cache")
KV_CAPACITY = re.compile(
    r"\b(\w[\w +]*?) KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
)
MAX_MODEL_LEN = re.compile(r"\bUsing max model len (\d+)")
VERSION = re.compile(r"Initializing a V1 LLM engine \(v([\w.+-]+)\)")
LOG_LEVEL = re.compile(r"\b(ERROR|WARNING|CRITICAL)\b")

# Warnings that change what the numbers mean; each gets a stable kind for gates.
NOTABLE_WARNINGS = {
    "uncalibrated_kv_scales": re.compile(r"Using KV cache scaling factor 1\.0"),
    "fp8_weight_only_fallback": re.compile(r"does not have native support for FP8 computation"),
}


def _num(s: str) -> int:
    return int(s.replace(",", ""))


def parse_engine_log(text: str) -> dict[str, Any]:
    kernels: dict[str, list[str]] = {}
    facts: dict[str, Any] = {
        "vllm_version": None,
        "linear_kernels": kernels,
        "attention_backend": None,
        "kv_cache_dtype": None,
        "kv_cache_pool": None,
        "kv_cache_tokens": None,
        "max_concurrency": None,
        "max_concurrency_at_tokens": None,
        "max_model_len": None,
        "warnings": [],
        "startup_phases_s": startup_breakdown(text),
    }
    seen_warnings: set[tuple[str, str]] = set()
    for line in text.splitlines():
        if m := KERNEL.search(line):
            kernel, target = m.group(1), m.group(2).strip()
            if kernel not in kernels.setdefault(target, []):
                kernels[target].append(kernel)
        if facts["attention_backend"] is None and (m := ATTENTION.search(line)):
            facts["attention_backend"] = m.group(1)
        if m := KV_DTYPE.search(line):
            facts["kv_cache_dtype"] = m.group(1)
        if m := KV_CAPACITY.search(line):
            facts["kv_cache_pool"] = m.group(1).strip()
            facts["kv_cache_tokens"] = _num(m.group(2))
            facts["max_concurrency_at_tokens"] = _num(m.group(3))
            facts["max_concurrency"] = float(m.group(4))
        if m := MAX_MODEL_LEN.search(line):
            facts["max_model_len"] = int(m.group(1))
        if m := VERSION.search(line):
            facts["vllm_version"] = m.group(1)
        for kind, pattern in NOTABLE_WARNINGS.items():
            if pattern.search(line):
                message = _strip_prefix(line)
                if (kind, message) not in seen_warnings:
                    seen_warnings.add((kind, message))
                    facts["warnings"].append({"kind": kind, "message": message[:400]})
    return facts


def _strip_prefix(line: str) -> str:
    """'(Worker pid=1) WARNING 11-29 16:37:47 [file.py:1] message' -> 'message'."""
    m = re.search(r"\[[\w./-]+:\d+\]\s*(.*)$", line)
    return (m.group(1) if m else line).strip()


def expected_but_missing(facts: dict[str, Any], *, quantized: bool, kv_cache_quantized: bool,
                         device: str) -> list[str]:
    """What the log should have told us for this checkpoint and device, and did not."""
    missing = []
    if quantized and not facts["linear_kernels"]:
        missing.append("linear kernel selection (no 'Selected/Using ...Kernel for ...' line)")
    if kv_cache_quantized and not facts["kv_cache_dtype"]:
        missing.append("KV cache dtype line ('Using fp8 data type to store kv cache')")
    if facts["kv_cache_tokens"] is None:
        missing.append("KV cache capacity ('... KV cache size: N tokens')")
    if device == "cuda" and facts["attention_backend"] is None:
        missing.append("attention backend ('Using ... attention backend')")
    return missing


# What a starting server is doing, from the last of these its log shows (CPU and CUDA wording).
STARTUP_PHASES = (
    ("Initializing a V1 LLM engine", "initializing the engine"),
    ("Starting to load model", "loading weights"),
    ("Loading model from scratch", "loading weights"),  # vLLM 0.33's CUDA model runner (V2, its default)
    ("Warming up model for the compilation", "compiling and warming up"),
    ("torch.compile", "compiling"),
    ("Compiling a graph", "compiling"),
    ("Memory profiling takes", "profiling memory"),
    ("KV cache size", "allocating the KV cache"),
    ("Capturing CUDA graph", "capturing CUDA graphs"),
    ("init engine (profile, create kv cache, warmup model) took", "starting the API server"),
    ("Starting vLLM server on", "API server up"),
    ("Application startup complete", "API server up"),
)


def startup_phase(log_tail: str) -> str | None:
    """The phase named by the latest marker line in the log's tail; None before the first."""
    best, best_at = None, -1
    for marker, phase in STARTUP_PHASES:
        at = log_tail.rfind(marker)
        if at > best_at:
            best, best_at = phase, at
    return best


TIMESTAMP = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")


def _seconds(line: str) -> int | None:
    m = TIMESTAMP.search(line)
    if not m:
        return None
    month, day, h, mi, sec = (int(x) for x in m.groups())
    return (((month * 31 + day) * 24 + h) * 60 + mi) * 60 + sec  # a monotonic key within one start


def startup_breakdown(text: str) -> dict[str, float]:
    """Seconds spent in each start-up phase, from the timestamps of the log lines that
    begin them (1 s resolution): 'before the engine' (the first log line to the engine's
    initialization: imports, argument parsing, the API process), then each phase until
    the next one starts, up to 'API server up' (uvicorn's own lines carry no timestamp).
    Empty when the log shows no phases."""
    marks: list[tuple[int, str]] = []
    first: int | None = None
    seen: set[str] = set()
    for line in text.splitlines():
        t = _seconds(line)
        if t is None:
            continue
        if first is None:
            first = t
        for marker, phase in STARTUP_PHASES:
            if marker in line and phase not in seen:
                seen.add(phase)
                marks.append((t, phase))
    if not marks or first is None:
        return {}
    out = {"before the engine": float(marks[0][0] - first)}
    for (t0, phase), (t1, _) in zip(marks, marks[1:], strict=False):
        out[phase] = out.get(phase, 0.0) + float(t1 - t0)
    return out


# Why a server died while starting, from its log: the first pattern that matches names the
# cause in one line (the log tail still follows in the error for the details).
FAILURE_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'"),
     "the engine build loaded on this host has no kernel op '{1}' (torch.ops.{0}): this scheme's kernel is "
     "missing from it"),
    (re.compile(r"Failed to find a kernel that can implement the (\w+) linear layer"),
     "vLLM has no kernel for the {0} linear layers of this checkpoint on this device"),
    (re.compile(r"Illegal instruction|SIGILL"),
     "the engine used a CPU instruction this host lacks (illegal instruction)"),
    (re.compile(r"(?:OutOfMemoryError|CUDA out of memory|Cannot allocate memory|std::bad_alloc|MemoryError\b)"),
     "out of memory while loading or warming up"),
    (re.compile(r"No available memory for the cache blocks|(?:KV cache|cache blocks).{0,80}(?:not enough|insufficient)",
                re.IGNORECASE),
     "no memory left for the KV cache (raise VLLM_CPU_KVCACHE_SPACE / gpu_memory_utilization, or lower "
     "max_model_len)"),
    (re.compile(r"Model architectures? \[?'?([\w, ']+?)'?\]? (?:are|is) not supported"),
     "vLLM does not support the model architecture {0}"),
    (re.compile(r"max_model_len.{0,80}(?:greater than|exceeds).{0,80}"),
     "max_model_len is larger than the model's context length (max_position_embeddings)"),
    (re.compile(r"(?:[Aa]ddress already in use|Errno 98)"), "the port is already in use"),
    (re.compile(r"pass the argument .?trust_remote_code=True"),
     "the model needs trust_remote_code, which the recipe does not allow"),
    (re.compile(r"There is no module or parameter named '([\w.]+)'"),
     "the checkpoint has a tensor the architecture does not know ('{0}'): not a checkpoint of this model"),
)
EXCEPTION_LINE = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?([A-Z]\w*(?:Error|Exception)): (.{1,300})$")


def diagnose_failure(text: str) -> str | None:
    """One line saying why a server died, from its log; None when the log does not say.
    A named pattern wins; otherwise the last Python exception line."""
    for pattern, cause in FAILURE_CAUSES:
        if m := pattern.search(text):
            return cause.format(*(g.strip(" '") for g in m.groups()))
    last = None
    for line in text.splitlines():
        if m := EXCEPTION_LINE.match(line.strip()):
            last = f"{m.group(1)}: {m.group(2).strip()}"
    return last
