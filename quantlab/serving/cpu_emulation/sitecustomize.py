"""Put on the serving environment's PYTHONPATH by quantlab when QUANTLAB_EMULATE_CPU=avx2:
torch then reports no AVX-512, no AVX-512 BF16 and no AMX, so vLLM loads its AVX2 kernel
library (`_C_AVX2`, chosen in vllm/platforms/cpu.py from these calls) and skips its AMX
kernels, as on an AVX2-only host. For tests and benchmarks on a richer CPU only.

The patch is applied when torch is first imported, not here: every Python started with this
on its path runs this file, and one that never uses torch (the CLI, a test's child) must not
load it (its threads and its import time are what some tests check)."""

import importlib.abc
import importlib.util
import os
import sys


def _patch(torch) -> None:
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


if os.environ.get("QUANTLAB_EMULATE_CPU", "").lower() == "avx2":
    if "torch" in sys.modules:
        _patch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _PatchTorchOnImport())
