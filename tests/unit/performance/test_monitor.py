"""The engine monitor's process sampling, on a process we control (this one, kept busy)."""

from __future__ import annotations

import os
import threading
import time

from quantlab.performance.monitor import Monitor, parse_metrics


def test_process_tree_cpu_and_rss_are_measured():
    """psutil reports CPU between two calls on the same Process object: a monitor that
    made new objects every sample would read 0% forever."""
    stop = threading.Event()

    def burn():
        while not stop.is_set():
            sum(range(10_000))

    worker = threading.Thread(target=burn)
    worker.start()
    try:
        monitor = Monitor("http://127.0.0.1:9", os.getpid(), device="cpu", interval_s=0.2).start()
        time.sleep(1.0)
        summary = monitor.stop()
    finally:
        stop.set()
        worker.join()
    assert summary["server_cpu_pct_mean"] > 10 and summary["server_rss_peak_bytes"] > 10e6
    assert summary["samples"] >= 1
    assert summary["metrics_available"] is False  # nothing listens on port 9: said, not guessed


def test_vllm_metrics_are_summed_over_labels():
    text = """# HELP vllm:num_preemptions Cumulative number of preemptions.
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""
    m = parse_metrics(text)
    assert m["vllm:num_preemptions_total"] == 5.0 and m["vllm:kv_cache_usage_perc"] == 0.25
