"""How fast this host multiplies matrices in each float dtype, as torch runs them here.

`matmul_speed` is self-contained (it imports only torch and time inside), because its
source is also sent to the serving environment's Python by the probe: the same
measurement decides the calibration dtype here and the serving dtype there.
"""

from __future__ import annotations

import inspect


def matmul_speed(dtypes=("float32", "bfloat16", "float16"), shape=(256, 576, 512), budget_s=2.0):
    """Median milliseconds of one (m x k) @ (k x n) matmul per dtype, the default model's
    width (576). A dtype that torch emulates takes 5-50x longer; `budget_s` bounds each
    dtype's repeats so the emulated ones stay cheap to measure."""
    import time

    import torch

    m, k, n = shape
    out = {"ms": {}, "shape": list(shape), "threads": torch.get_num_threads(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    gen = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    for name in dtypes:
        a, b = a32.to(getattr(torch, name)), b32.to(getattr(torch, name))
        a @ b  # first use: kernel selection and packing
        times = []
        started = time.perf_counter()
        while len(times) < 7 and (len(times) < 2 or time.perf_counter() - started < budget_s):
            t = time.perf_counter()
            a @ b
            times.append((time.perf_counter() - t) * 1000)
        out["ms"][name] = round(sorted(times)[len(times) // 2], 3)
    return out


def measure():
    """matmul_speed in this process; an error is recorded, not raised (no speed: no change)."""
    try:
        return matmul_speed()
    except Exception as err:  # noqa: BLE001 - a failed measurement means "keep the recipe's dtype"
        return {"ms": {}, "error": f"{type(err).__name__}: {err}"}


def source() -> str:
    """matmul_speed and measure as source, for a Python that does not have quantlab installed."""
    return inspect.getsource(matmul_speed) + "\n\n" + inspect.getsource(measure)
