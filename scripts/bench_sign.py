"""Time to hash, sign and verify a checkpoint folder with model-signing (EC P-256 key),
next to a plain sha256 of the same files, in one process, medians of --repeats.

    .venv/bin/python scripts/bench_sign.py CHECKPOINT_DIR [--repeats 3]

Works on a copy, so the folder itself is not touched.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(REPO))
    from quantlab.release.manifest import (
        MANIFEST_FILE,
        SIGNATURE_FILE,
        folder_files,
        generate_keypair,
        sign_folder,
        verify_signature,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ql-sign-"))
    folder = work / "ckpt"
    shutil.copytree(args.checkpoint, folder, ignore=shutil.ignore_patterns(MANIFEST_FILE, SIGNATURE_FILE))
    generate_keypair(work / "k.pem", work / "k.pub.pem")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    times: dict[str, list[float]] = {"sha256 of every file": [], "model-signing sign": [], "model-signing verify": []}
    for _ in range(args.repeats):
        t = time.perf_counter()
        folder_files(folder)
        times["sha256 of every file"].append(time.perf_counter() - t)
        t = time.perf_counter()
        sign_folder(folder, method="key", private_key=work / "k.pem")
        times["model-signing sign"].append(time.perf_counter() - t)
        t = time.perf_counter()
        assert verify_signature(folder, public_key=work / "k.pub.pem") is None
        times["model-signing verify"].append(time.perf_counter() - t)
    print(f"workload: {args.checkpoint} ({size / 1e6:.1f} MB, {len(list(folder.iterdir()))} files), "
          f"medians of {args.repeats}")
    for name, vals in times.items():
        print(f"| {name} | {statistics.median(vals):.2f} s | {size / 1e6 / statistics.median(vals):.0f} MB/s |")
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
