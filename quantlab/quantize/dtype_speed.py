"""How fast this host multiplies matrices in each float dtype, as torch runs them here.

`matmul_speed` is self-contained (it imports only torch and time inside), because its
source is also sent to the serving environment's Python by the probe: the same
measurement decides the calibration dtype here and the serving dtype there.
"""

from __future__ import annotations

import inspect


def matmul_speed(dtypes=("float32", "bfloat16", "float16"), shape=(256, 576, 512), budget_s=2.0, rounds=9):
    """Fastest milliseconds of one (m x k) @ (k x n) matmul per dtype, the default model's
    width (576), on one thread, over `rounds` interleaved rounds.

    Built for a choice that holds from run to run on a busy host. On two threads a matmul
    waits for whichever thread the scheduler took away, so beside a test suite every dtype
    measured about 8 ms (a time slice), and the median of each dtype's own repeats put bf16
    at 1.0x float32 where a quiet host measured 3.4x (Xeon without BF16). One thread, the
    dtypes interleaved and the minimum kept: 4.5-8.7x loaded, 4.9-5.2x quiet, there. A dtype
    that torch emulates takes 5-100x longer; once it has spent `budget_s` it is timed no
    more (at least twice), so the emulated ones stay cheap to measure."""
    import time

    import torch

    m, k, n = shape
    threads = torch.get_num_threads()
    out = {"ms": {}, "shape": list(shape), "threads": 1, "statistic": "min",
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    gen = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    torch.set_num_threads(1)
    try:
        operands = {}
        for name in dtypes:
            operands[name] = (a32.to(getattr(torch, name)), b32.to(getattr(torch, name)))
            operands[name][0] @ operands[name][1]  # first use: kernel selection and packing
        times = {name: [] for name in dtypes}
        spent = dict.fromkeys(dtypes, 0.0)
        for _ in range(rounds):
            for name in dtypes:
                if len(times[name]) >= 2 and spent[name] >= budget_s:
                    continue
                a, b = operands[name]
                t = time.perf_counter()
                a @ b
                took = time.perf_counter() - t
                spent[name] += took
                times[name].append(took * 1000)
    finally:
        torch.set_num_threads(threads)  # the caller's (calibration runs in this process)
    for name in dtypes:
        out["ms"][name] = round(min(times[name]), 3)
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
