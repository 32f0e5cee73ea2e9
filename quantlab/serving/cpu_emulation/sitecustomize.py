"""Put on the serving environment's PYTHONPATH by quantlab when QUANTLAB_EMULATE_CPU=avx2:
torch then reports no AVX-512, no AVX-512 BF16 and no AMX, so vLLM loads its AVX2 kernel
library (`_C_AVX2`, chosen in vllm/platforms/cpu.py from these calls) and skips its AMX
kernels, as on an AVX2-only host. For tests and benchmarks on a richer CPU only."""

import os

if os.environ.get("QUANTLAB_EMULATE_CPU", "").lower() == "avx2":
    import torch

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    torch.cpu._is_amx_tile_supported = lambda: False
