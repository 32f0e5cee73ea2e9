"""What the engine and the machine do while a load runs: vLLM's Prometheus /metrics
(KV-cache usage, queue, preemptions) and the server process tree's CPU and resident
memory (psutil), sampled in a background thread; GPU utilisation and memory through
NVML when the server runs on a local NVIDIA GPU."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from quantlab.serving import api_keys

# vLLM's metric names (0.32/0.33); older releases called KV usage gpu_cache_usage_perc.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
COUNTERS = {"preemptions": "vllm:num_preemptions"}
HISTOGRAMS = {"queue_time_mean_s": "vllm:request_queue_time_seconds"}


def parse_metrics(text: str) -> dict[str, float]:
    """The few vLLM series we use, summed over label sets, from Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


class Monitor:
    """Samples every `interval_s` between start() and stop(); never raises from the thread."""

    def __init__(self, base_url: str, pid: int | None, *, device: str, interval_s: float = 0.5):
        self.base_url = base_url.rstrip("/")
        self.pid = pid
        self.device = device
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: dict[str, float] | None = None
        self._last: dict[str, float] | None = None
        self._procs: dict[int, Any] = {}  # psutil measures CPU between two calls on the same object

    def _scrape(self) -> dict[str, float] | None:
        try:
            r = httpx.get(self.base_url + "/metrics", timeout=2, headers=api_keys.headers(self.base_url))
            return parse_metrics(r.text) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def _process_tree(self) -> tuple[float | None, int | None]:
        if self.pid is None:
            return None, None
        import psutil

        try:
            root = self._procs.setdefault(self.pid, psutil.Process(self.pid))
            procs = [root] + [self._procs.setdefault(c.pid, c) for c in root.children(recursive=True)]
            cpu, rss = 0.0, 0
            for p in procs:
                try:
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            return cpu, rss
        except psutil.Error:
            return None, None

    def _gpu(self) -> dict[str, Any]:
        if self.device != "cuda":
            return {}
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            return {"gpu_util_pct": float(util.gpu), "gpu_mem_used_bytes": int(mem.used),
                    "gpu_mem_total_bytes": int(mem.total)}
        except Exception:  # NVML missing or not usable: GPU figures are simply absent
            return {}

    def _loop(self) -> None:
        t0 = time.monotonic()
        self._process_tree()  # prime psutil's cpu_percent
        stopping = False
        while not stopping:
            stopping = self._stop.wait(self.interval_s)  # one last sample when stopped: short points get one too
            metrics = self._scrape()
            cpu, rss = self._process_tree()
            sample: dict[str, Any] = {"t": round(time.monotonic() - t0, 3), "cpu_pct": cpu, "rss_bytes": rss,
                                      **self._gpu()}
            if metrics is not None:
                self._last = metrics
                sample["kv_cache_usage"] = next((metrics[k] for k in KV_USAGE if k in metrics), None)
                for key, name in GAUGES.items():
                    sample[key] = metrics.get(name)
            self.samples.append(sample)

    def start(self) -> "Monitor":
        self._first = self._scrape()
        self._thread = threading.Thread(target=self._loop, name="quantlab-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        last = self._scrape() or self._last
        return self.summary(self._first, last)

    def summary(self, first: dict[str, float] | None, last: dict[str, float] | None) -> dict[str, Any]:
        def peak(key: str) -> float | None:
            vals = [s[key] for s in self.samples if s.get(key) is not None]
            return max(vals) if vals else None

        def mean(key: str) -> float | None:
            vals = [s[key] for s in self.samples if s.get(key) is not None]
            return sum(vals) / len(vals) if vals else None

        out: dict[str, Any] = {
            "samples": len(self.samples),
            "kv_cache_usage_peak": peak("kv_cache_usage"),
            "waiting_peak": peak("waiting"),
            "running_peak": peak("running"),
            "server_cpu_pct_mean": mean("cpu_pct"),
            "server_rss_peak_bytes": peak("rss_bytes"),
            "gpu_util_pct_mean": mean("gpu_util_pct"),
            "gpu_mem_used_peak_bytes": peak("gpu_mem_used_bytes"),
            "preemptions": None,
            "queue_time_mean_s": None,
            "metrics_available": first is not None and last is not None,
        }
        if first is not None and last is not None:
            for key, name in COUNTERS.items():
                total = name + "_total"
                if total in last:
                    out[key] = last[total] - first.get(total, 0.0)
            for key, name in HISTOGRAMS.items():
                s, c = name + "_sum", name + "_count"
                if s in last and c in last and last[c] - first.get(c, 0.0) > 0:
                    out[key] = (last[s] - first.get(s, 0.0)) / (last[c] - first.get(c, 0.0))
        return out
