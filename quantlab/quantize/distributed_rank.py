"""One rank of `quantization.distributed` (quantize/distributed.py), started by torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node=N -m quantlab.quantize.distributed_rank \\
        RANK_RECIPE.json OUTPUT
    python -m torch.distributed.run --standalone --nproc-per-node=N -m quantlab.quantize.distributed_rank --check

Each rank joins the process group on the accelerator of its local rank and runs the same
quantization as one process does (llm-compressor splits the calibration samples across
the ranks); rank 0 writes OUTPUT. `--check` is the launch's handshake only: a gloo
process group, one all-reduce of the ranks, rank 0 printing what it saw (no accelerator
needed; what the tests run on a CPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def check() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo", init_method="env://")
    total = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(json.dumps({"world_size": dist.get_world_size(), "rank_sum": int(total.item()), "backend": "gloo"}))
    dist.destroy_process_group()
    return 0


def quantize(rank_recipe: Path, output: Path) -> int:
    import torch.distributed as dist
    from compressed_tensors.distributed import init_dist

    from quantlab.models.source import resolve_recipe_model
    from quantlab.quantize.llmcompressor import calibrate_as_rank, quantize_checkpoint
    from quantlab.recipe.file import LoadedRecipe, Recipe

    init_dist()
    rank = dist.get_rank()
    data = json.loads(rank_recipe.read_text())
    loaded = LoadedRecipe(recipe=Recipe.model_validate(data["recipe"]), path=Path(data["path"]))
    said = print if rank == 0 else (lambda _msg: None)
    model_ref = resolve_recipe_model(loaded, progress=said)
    try:  # every rank calibrates its share of the samples; rank 0 exports the checkpoint
        if rank == 0:
            quantize_checkpoint(loaded, model_ref, output, overwrite=True, progress=said, log_file=None)
        else:
            calibrate_as_rank(loaded, model_ref)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        return check()
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    return quantize(Path(argv[0]), Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
