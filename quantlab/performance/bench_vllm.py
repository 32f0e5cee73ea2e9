"""One result of `vllm bench serve --save-result --save-detailed` (vLLM 0.32/0.33) as
quantlab's per-request records (pure).

Read from vLLM's own code (vllm/benchmarks/serve.py, vllm/benchmarks/lib/endpoint_request_func.py):
the per-request arrays (input_lens, output_lens, ttfts, itls, latencies, start_times, errors,
generated_texts) are index-aligned, one entry per request in the order they were issued; all but
`latencies` (and `queue_times`) are written only with --save-detailed. There is no success flag:
a failed request has an error text (an HTTP reason, a traceback, or "Never received a valid
chunk..."), but a non-200 answer with an empty reason fails with "", so the count of error texts
is held to the file's `failed`. `latencies` is the last streamed chunk's time less the send
time (= ttft + sum(itls)), kept as the E2E; `start_times` are perf_counter readings taken as
each request was sent (after the --max-concurrency semaphore). A failed request's times are 0
and its output_lens 0: it is kept as an error, without times.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any

from quantlab.performance import bench_fields as f
from quantlab.performance.metrics import RequestRecord

ROWS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")
# vllm bench's own top-level keys; any other string-valued one came from --metadata KEY=VALUE
OWN_KEYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
            "burstiness", "max_concurrency", "ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps",
            "duration", "completed", "failed", "queue_times", "generated_texts", "rps_change_events"}
FIX = "rerun `vllm bench serve` with --save-result --save-detailed and give that file"


def is_vllm_result(doc: dict[str, Any]) -> bool:
    return {"duration", "completed"} <= doc.keys() and ("backend" in doc or "endpoint_type" in doc)


def parse(path: Path, doc: dict[str, Any], where: str = "") -> f.Parsed:
    """One result object; `where` prefixes its fields' names (an appended file's "result 2: ")."""
    n = _requests(path, doc, where)
    errors = doc["errors"]
    if any(not isinstance(e, str) for e in errors):
        raise f.refuse(path, where + "errors", "an entry that is not text",
                       "each request's error text (\"\" where it succeeded)", FIX)
    bad = sum(e != "" for e in errors)
    if bad != doc["failed"]:
        raise f.refuse(path, where + "errors", f"{bad} request(s) with an error text against failed = {doc['failed']}",
                       "as many error texts as failed requests (vllm bench saves no per-request success flag: a "
                       "request without an error text is read as successful)", f"give the file unedited, or {FIX}")
    wall = f.duration(path, where + "duration", doc["duration"], FIX)
    conc = doc.get("max_concurrency")
    conc = None if conc is None else f.count(path, where + "max_concurrency", conc, FIX, least=1)
    rate = doc.get("request_rate")
    rate = None if rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate)) else \
        f.rate(path, where + "request_rate", rate, FIX)
    return f.Parsed(records=_records(path, doc, where, n), wall_s=wall, concurrency=conc, request_rate=rate,
                    facts=_facts(doc, rate))


def _requests(path: Path, doc: dict[str, Any], where: str) -> int:
    """How many requests the file holds, its per-request arrays checked against it."""
    missing = [k for k in ROWS if not isinstance(doc.get(k), list)]
    if missing and "total_input_sequences" in doc:
        raise f.refuse(path, where + missing[0], "an embedding (pooling) benchmark, which times no tokens",
                       "a text generation benchmark's per-request rows", "benchmark a generating model")
    if missing:
        raise f.refuse(path, where + missing[0], f"no per-request rows ({', '.join(missing)} missing): the "
                       "benchmark was saved without --save-detailed", "the per-request arrays --save-detailed "
                       "writes", FIX)
    n = f.count(path, where + "completed", doc["completed"], FIX) + \
        f.count(path, where + "failed", f.get(path, doc, "failed", FIX, where=where), FIX)
    for key in ROWS:
        if len(doc[key]) != n:
            raise f.refuse(path, where + key, f"{len(doc[key])} entries", f"one per request: completed + failed "
                           f"= {n}", f"give the file as vllm bench wrote it, or {FIX}")
    if n == 0:
        raise f.refuse(path, where + "completed", "zero requests", "at least one request", FIX)
    return n


def _records(path: Path, doc: dict[str, Any], where: str, n: int) -> list[RequestRecord]:
    starts = [f.clock(path, f"{where}start_times[{i}]", t, FIX) for i, t in enumerate(doc["start_times"])]
    first = min(starts)
    texts = doc.get("generated_texts") if isinstance(doc.get("generated_texts"), list) else []
    records = []
    for i in range(n):
        rec = RequestRecord(index=i, outcome="ok", sent_at=starts[i] - first,
                            prompt_tokens=f.count(path, f"{where}input_lens[{i}]", doc["input_lens"][i], FIX),
                            output_tokens=f.count(path, f"{where}output_lens[{i}]", doc["output_lens"][i], FIX),
                            text=texts[i] if i < len(texts) and isinstance(texts[i], str) else "")
        if doc["errors"][i]:
            # a traceback ends with the exception: keep its end
            rec.outcome, rec.error = "error", doc["errors"][i].strip()[-f.ERROR_CHARS:]
        else:
            rec.ttft = f.seconds(path, f"{where}ttfts[{i}]", doc["ttfts"][i], FIX)
            rec.e2e = f.seconds(path, f"{where}latencies[{i}]", doc["latencies"][i], FIX)
            itl = doc["itls"][i]
            if not isinstance(itl, list):
                raise f.refuse(path, f"{where}itls[{i}]", f"{itl!r}", "the request's list of inter-token times", FIX)
            rec.itl = [f.seconds(path, f"{where}itls[{i}][{j}]", x, FIX) for j, x in enumerate(itl)]
        records.append(rec)
    return records


def _facts(doc: dict[str, Any], rate: float | None) -> dict[str, Any]:
    """vllm bench saves the model, the tokenizer, its client backend, the arrivals and its local
    date; not the seed, the endpoint's path or URL, the dataset, its warm-ups, its own version,
    the server's engine or hardware."""
    labels = {k: v for k, v in doc.items() if k not in OWN_KEYS and isinstance(v, str)}
    if doc.get("label") is not None:
        labels["label"] = doc["label"]
    if doc.get("ramp_up_strategy"):
        arrivals = (f"ramp-up {doc['ramp_up_strategy']} from {doc.get('ramp_up_start_rps')} to "
                    f"{doc.get('ramp_up_end_rps')} requests/s")
    elif rate is None:
        arrivals = "closed loop (a request sent as one in flight ends)" if doc.get("max_concurrency") \
            else "all at once"
    else:
        burst = doc.get("burstiness", 1.0)
        arrivals = "poisson" if burst == 1.0 else f"gamma (burstiness {burst})"
    return {"model": doc.get("model_id"), "tokenizer": doc.get("tokenizer_id"),
            "backend": doc.get("backend") or doc.get("endpoint_type"), "date": _date(doc.get("date")),
            "arrivals": arrivals, "cooldown_s": 0.0, "labels": labels,
            "sent_at": "seconds after the benchmark's first request was sent (its start_times)"}


def _date(value: Any) -> str | None:
    """vllm bench's `date` (%Y%m%d-%H%M%S, the client's local time, no zone) as ISO 8601."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.strptime(value, "%Y%m%d-%H%M%S").isoformat()
    except ValueError:
        return value
