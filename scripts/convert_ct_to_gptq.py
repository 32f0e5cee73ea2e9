#!/usr/bin/env python3
"""Convert a compressed-tensors W4A16 checkpoint (symmetric int4, group-wise,
pack-quantized, as llm-compressor's GPTQ/RTN/AWQ W4A16 recipes export it) into the
GPTQ format AutoGPTQ and GPTQModel write (`quant_method: gptq`, checkpoint format
"gptq": qweight/qzeros/scales/g_idx per linear layer), which vLLM serves with its own
GPTQ code path.

Why: `quantlab validate` accepts checkpoints made by other tools; this gives one here
without a GPU or a network (GPTQModel and AutoGPTQ build GPU kernels at install time).
The weights are bit-for-bit the same integers and scales, only laid out differently.

Usage: python scripts/convert_ct_to_gptq.py SRC_DIR DST_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BITS = 4
PACK = 32 // BITS  # int4 values per int32


def unpack_rows(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """compressed-tensors pack-quantized: [out, in/8] int32, value k of a word in bits
    4k..4k+3, stored with +8 offset (unsigned). Returns [out, in] in 0..15."""
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32)
    u = (packed.unsqueeze(-1) >> shifts) & 0xF
    return u.reshape(packed.shape[0], -1)[:, :cols]


def pack_columns(u: torch.Tensor) -> torch.Tensor:
    """GPTQ qweight: [in/8, out] int32 packing 8 consecutive input rows of u^T."""
    t = u.t().contiguous().to(torch.int32)  # [in, out]
    t = t.reshape(t.shape[0] // PACK, PACK, t.shape[1])
    out = torch.zeros(t.shape[0], t.shape[2], dtype=torch.int32)
    for k in range(PACK):
        out |= t[:, k, :] << (BITS * k)
    return out


def convert_layer(packed: torch.Tensor, scale: torch.Tensor, shape: torch.Tensor, group_size: int
                  ) -> dict[str, torch.Tensor]:
    out_features, in_features = (int(x) for x in shape.tolist())
    if in_features % PACK or out_features % PACK or in_features % group_size:
        raise ValueError(f"layer {out_features}x{in_features} does not fit GPTQ packing (multiples of {PACK}, "
                         f"group {group_size})")
    u = unpack_rows(packed, in_features)  # [out, in], uint4 with bias 8
    groups = in_features // group_size
    # AutoGPTQ's "gptq" (v1) format stores zero - 1: symmetric int4 has zero 8, stored as 7
    zeros = torch.full((groups, out_features), 8 - 1, dtype=torch.int32)
    zeros = zeros.reshape(groups, out_features // PACK, PACK)
    qzeros = torch.zeros(groups, out_features // PACK, dtype=torch.int32)
    for k in range(PACK):
        qzeros |= zeros[:, :, k] << (BITS * k)
    return {"qweight": pack_columns(u), "qzeros": qzeros, "scales": scale.t().contiguous().to(torch.float16),
            "g_idx": (torch.arange(in_features, dtype=torch.int32) // group_size)}


def convert(src: Path, dst: Path) -> None:
    config = json.loads((src / "config.json").read_text())
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") != "compressed-tensors" or qc.get("format") != "pack-quantized":
        raise SystemExit(f"{src}: not a compressed-tensors pack-quantized checkpoint")
    [group] = qc["config_groups"].values()
    w = group["weights"]
    if (w["num_bits"], w["type"], w["symmetric"], w["strategy"]) != (4, "int", True, "group"):
        raise SystemExit(f"{src}: only symmetric int4 group-wise weights convert (found {w})")
    if w.get("actorder") not in (None, "static", "group") or group.get("input_activations"):
        raise SystemExit(f"{src}: weight-only W4A16 with contiguous groups only")
    gs = int(w["group_size"])
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(f))
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(".weight_packed"):
            base = name[: -len(".weight_packed")]
            for k, v in convert_layer(t, tensors[f"{base}.weight_scale"], tensors[f"{base}.weight_shape"],
                                      gs).items():
                out[f"{base}.{k}"] = v
        elif not name.endswith((".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx")):
            out[name] = t
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and p.suffix != ".safetensors" and not p.name.startswith("quantlab-"):
            shutil.copy2(p, tmp / p.name)
    config["quantization_config"] = {"quant_method": "gptq", "bits": BITS, "group_size": gs, "desc_act": False,
                                     "sym": True, "checkpoint_format": "gptq", "true_sequential": True,
                                     "damp_percent": 0.01, "static_groups": False,
                                     "modules_in_block_to_quantize": None}
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "quantize_config.json").write_text(json.dumps(config["quantization_config"], indent=2))
    save_file(out, tmp / "model.safetensors", metadata={"format": "pt"})
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"wrote {sys.argv[2]} (GPTQ format)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
