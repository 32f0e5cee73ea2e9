"""Put on the serving environment's PYTHONPATH by quantlab when QUANTLAB_EMULATE_CPU is set:
torch then reports what the emulated kind lacks, so vLLM loads that kind's kernel library
(chosen in vllm/platforms/cpu.py from these calls) and skips its AMX kernels. `avx2`: no
AVX-512, no AVX-512 BF16, no AMX (`_C_AVX2`); `avx512`: AVX-512 without BF16 or AMX
(`_C_AVX512`). For tests and benchmarks on a richer CPU only.

The patch is applied when torch is first imported, not here: every Python started with this
on its path runs this file, and one that never uses torch (the CLI, a test's child) must not
load it (its threads and its import time are what some tests check)."""

import importlib.abc
import importlib.util
import os
import sys


KIND = os.environ.get("QUANTLAB_EMULATE_CPU", "").strip().lower()


def _patch(torch) -> None:
    if KIND == "avx2":
        torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    torch.cpu._is_amx_tile_supported = lambda: False


class _PatchTorchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # once: the real finders locate torch
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if KIND in ("avx2", "avx512"):
    if "torch" in sys.modules:
        _patch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _PatchTorchOnImport())
