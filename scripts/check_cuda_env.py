"""Does the CUDA serving environment's pin set resolve? pip's own resolver, run as a dry
run for a Linux CUDA host: nothing is installed, nothing is built, no GPU is needed.

    .venv/bin/python scripts/check_cuda_env.py [-r requirements/serve-cuda.txt] [-c FILE]
        [--python-version 3.11] [--glibc 2.35] [--arch x86_64] [--no-pip-config] [--keep DIR]
        [--timeout 900]

scripts/setup.sh builds .venv-vllm on an NVIDIA machine with `pip install -r
requirements/serve-cuda.txt` from the package index pip is configured with (vLLM's wheel
pulls its CUDA torch from there), so this asks the same pip, with the same configuration,
to resolve the same file for the target platform instead of this one (--no-pip-config: from
pip's default index alone, without this machine's mirrors, find-links or constraint files,
which pip's own configuration may add). pip downloads the wheels it has to read metadata
from (vLLM's and torch's are hundreds of MB each) into a temporary folder it removes:
expect about a minute on a fast network.

Prints the resolved versions of the packages that decide serving (vLLM, torch and the CUDA
it was built for, compressed-tensors, transformers, triton, FlashInfer, Ray) and exits 0;
where the pins cannot be met it prints each clash condensed from pip's message (which
requirement against which, or which package has no wheel for the platform) and exits 1;
bad input exits 2; a check that could not run (deadline, index unreachable, pip failing
otherwise) exits 3. --keep DIR keeps pip's --report JSON, its output and the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REQUIREMENTS = REPO / "requirements" / "serve-cuda.txt"
# the packages that decide what serves, in the order they are printed
KEY_PACKAGES = ("vllm", "torch", "torchvision", "torchaudio", "compressed-tensors", "transformers", "triton",
                "flashinfer-python", "xformers", "ray", "cuda-toolkit", "nvidia-cuda-runtime",
                "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-nccl-cu12",
                "nvidia-nccl-cu13")
# a CUDA runtime pin in torch's metadata: cuda-toolkit[...]==13.0.3 (CUDA 13 wheels),
# nvidia-cuda-runtime-cu12==12.8.90 (CUDA 12 wheels)
TORCH_CUDA_PIN = re.compile(r"^(?:cuda-toolkit|nvidia-cuda-runtime(?:-cu\d+)?)\s*(?:\[[^\]]*\])?\s*==\s*(\d+)\.(\d+)")
EXIT_RESOLVES, EXIT_CONFLICT, EXIT_BAD_INPUT, EXIT_NOT_CHECKED = 0, 1, 2, 3


def canonical(name: str) -> str:
    """PEP 503's normalised project name: what pip compares."""
    return re.sub(r"[-_.]+", "-", name).lower()


def platform_tags(glibc: str, arch: str) -> list[str]:
    """The wheel platform tags pip accepts on a Linux host with this glibc: every
    manylinux_2_N from the glibc's minor down to 17, their legacy aliases and linux_<arch>.
    (pip takes --platform literally: one manylinux_2_35 tag alone would refuse the
    manylinux2014 wheels that host installs.)"""
    m = re.fullmatch(r"2\.(\d+)", glibc.strip())
    if not m or int(m.group(1)) < 17:
        raise ValueError(f"--glibc {glibc!r}: expected a glibc version 2.17 or newer, such as 2.35")
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(int(m.group(1)), 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]


def pip_command(python: str, requirements: list[Path], constraints: list[Path], *, python_version: str,
                glibc: str, arch: str, target: Path, report: Path) -> list[str]:
    """pip's dry run for the target platform (pip wants --target with platform options)."""
    abi = "cp" + python_version.replace(".", "")
    cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--disable-pip-version-check",
           "--target", str(target), "--report", str(report), "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for tag in platform_tags(glibc, arch):
        cmd += ["--platform", tag]
    for r in requirements:
        cmd += ["-r", str(r)]
    for c in constraints:
        cmd += ["-c", str(c)]
    return cmd


# ---------------------------------------------------------------- pip's --report
def resolved_versions(report: dict) -> dict[str, str]:
    """{canonical name: version} of everything pip would install (its --report, format 1)."""
    if str(report.get("version")) != "1" or not isinstance(report.get("install"), list):
        raise ValueError(f"not a pip installation report of format 1 (version {report.get('version')!r})")
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def torch_cuda(report: dict) -> str | None:
    """The CUDA major.minor the resolved torch wheel was built for, from its own pins."""
    for item in report.get("install", []):
        meta = item["metadata"]
        if canonical(meta["name"]) == "torch":
            for requirement in meta.get("requires_dist") or []:
                if m := TORCH_CUDA_PIN.match(requirement):
                    return f"{m.group(1)}.{m.group(2)}"
    return None


def key_versions(report: dict) -> dict[str, str]:
    """The versions that decide serving, in KEY_PACKAGES order; absent ones left out."""
    versions = resolved_versions(report)
    return {name: versions[name] for name in KEY_PACKAGES if name in versions}


# ---------------------------------------------------------------- pip's failure text
@dataclass
class Clash:
    """One package whose demands cannot all be met, or that has no wheel for the platform."""

    package: str
    # (who asks: "vllm 0.33.0", "requested" (a requirements file) or "constraint"; the requirement)
    demands: list[tuple[str, str]] = field(default_factory=list)
    no_distribution: bool = False
    available: str | None = None  # pip's "(from versions: ...)" where it said it

    def line(self) -> str:
        """'lark: vllm 0.33.0 depends on lark==1.2.2  <->  constraint lark==1.3.1', or the package
        no wheel of which meets a requirement here."""
        if self.no_distribution:
            wanted = " and ".join(req if who == "requested" else f"{req} (required by {who})"
                                  for who, req in self.demands)
            seen = f" (versions pip saw for this platform: {self.available})" if self.available else ""
            return f"{self.package}: no wheel for this platform and Python meets {wanted}{seen}"
        return f"{self.package}: " + "  <->  ".join(
            f"{who} {req}" if who in ("requested", "constraint") else f"{who} depends on {req}"
            for who, req in self.demands)


DEPENDS = re.compile(r"^(\S+ \S+) depends on (.+)$")
USER = re.compile(r"^The user requested (\(constraint\) )?(.+)$")
NO_VERSION = re.compile(r"Could not find a version that satisfies the requirement (.+?) \(from versions: (.*)\)$")
NO_DISTRIBUTION = re.compile(r"No matching distribution found for (.+)$")
CANNOT_INSTALL = re.compile(r"Cannot install (.+?) because these package versions have conflicting dependencies")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _requirement_name(requirement: str) -> str:
    m = NAME.match(requirement.strip())
    return canonical(m.group(0)) if m else requirement.strip()


def _conflict_block(lines: list[str]) -> list[tuple[str, str]]:
    """The (who, requirement) lines under pip's 'The conflict is caused by:'."""
    start = next((i for i, line in enumerate(lines) if line.strip() == "The conflict is caused by:"), None)
    out: list[tuple[str, str]] = []
    for line in lines[start + 1:] if start is not None else []:
        text = line.strip()
        if not text:
            break
        if m := DEPENDS.match(text):
            out.append((m.group(1), m.group(2).strip()))
        elif m := USER.match(text):
            out.append(("constraint" if m.group(1) else "requested", m.group(2).strip()))
    return out


def parse_failure(text: str) -> tuple[list[Clash], str | None]:
    """pip's output of a failed resolution -> (the clashes, the top-level requirements pip
    named as not installable together); ([], None) when the text shows no resolution failure."""
    lines = [re.sub(r"^ERROR: ", "", line) for line in text.splitlines()]
    clashes: dict[str, Clash] = {}
    for who, requirement in _conflict_block(lines):
        name = _requirement_name(requirement)
        clashes.setdefault(name, Clash(name)).demands.append((who, requirement))
    for line in lines:
        m = NO_VERSION.search(line) or NO_DISTRIBUTION.search(line)
        if m:
            name = _requirement_name(m.group(1))
            clash = clashes.setdefault(name, Clash(name))
            clash.no_distribution = True
            if m.re is NO_VERSION:
                clash.available = _last_versions(m.group(2))
            if not clash.demands:
                clash.demands.append(_who_and_requirement(m.group(1)))
    cannot = next((m.group(1) for line in lines if (m := CANNOT_INSTALL.search(line))), None)
    return list(clashes.values()), cannot


def _who_and_requirement(text: str) -> tuple[str, str]:
    """'llguidance<1.8,>=1.7; platform_machine == "x86_64" (from vllm)' -> ('vllm', 'llguidance<1.8,>=1.7'):
    the environment markers dropped (they held, or pip would not have asked)."""
    text = text.strip()
    m = re.search(r" \(from ([^()]+)\)$", text)
    who, requirement = (m.group(1), text[:m.start()]) if m else ("requested", text)
    return who, requirement.split(";", 1)[0].strip()


def _last_versions(listing: str, keep: int = 5) -> str | None:
    versions = [v.strip() for v in listing.split(",") if v.strip()]
    if not versions or versions == ["none"]:
        return None
    return ("..., " if len(versions) > keep else "") + ", ".join(versions[-keep:])


def index_unreachable(text: str) -> bool:
    """pip found no version of anything because it reached no index (not a pin problem)."""
    network = re.search(r"NewConnectionError|Could not fetch URL|ConnectTimeout|Temporary failure in name "
                        r"resolution|SSLError|ProxyError", text)
    return bool(network) and "(from versions: none)" in text


# ---------------------------------------------------------------- running pip
@dataclass
class PipRun:
    returncode: int | None  # None: killed at the deadline
    output: str  # stdout and stderr together (pip prints its conflict block on stdout)
    report: dict | None
    wall_s: float
    pip_version: str | None


# what decides where pip looks and what it may pick, besides the command line
PIP_INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT",
                       "PIP_REQUIREMENT", "PIP_PRE", "PIP_ONLY_BINARY", "PIP_NO_BINARY")


def pip_environment(environ: dict[str, str], *, own_config: bool) -> dict[str, str]:
    """pip's environment: as given (the configuration setup.sh's pip reads too), or with
    every configuration file skipped (pip's rule for PIP_CONFIG_FILE=os.devnull) and the
    index variables dropped: the package index alone, with no machine's mirrors or caps."""
    if own_config:
        return dict(environ)
    env = {k: v for k, v in environ.items() if k not in PIP_INDEX_VARIABLES}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def run_pip(cmd: list[str], report_path: Path, timeout_s: float, env: dict[str, str]) -> PipRun:
    """pip in its own process group, killed with everything it started at the deadline."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        code = None
    report = json.loads(report_path.read_text()) if code == 0 and report_path.is_file() else None
    version = report.get("pip_version") if report else _pip_version(cmd[0])
    return PipRun(code, output or "", report, time.monotonic() - t0, version)


def _pip_version(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.split()[1] if out.startswith("pip ") else None


# ---------------------------------------------------------------- the verdict
def summarize(run: PipRun, *, where: str) -> tuple[int, dict, list[str]]:
    """(exit code, the summary record, the lines to print) of one pip run."""
    head = f"{where}; pip {run.pip_version or '?'}; {run.wall_s:.1f} s"
    if run.returncode is None:
        return EXIT_NOT_CHECKED, {"status": "not checked", "why": "deadline"}, [
            f"NOT CHECKED: pip did not finish before the deadline ({head}); raise --timeout"]
    if run.returncode == 0 and run.report is not None:
        return _resolved(run, head)
    if index_unreachable(run.output):
        return EXIT_NOT_CHECKED, {"status": "not checked", "why": "index unreachable"}, [
            f"NOT CHECKED: pip reached no package index ({head}); its output ends:", *run.output.splitlines()[-8:]]
    clashes, cannot = parse_failure(run.output)
    if nothing := [c for c in clashes if c.no_distribution and not c.available and c.demands[0][0] == "requested"]:
        return EXIT_NOT_CHECKED, {"status": "not checked", "why": "no distribution at all"}, [
            f"NOT CHECKED: pip found no distribution at all of {nothing[0].demands[0][1]} ({head}): the index "
            "is unreachable, or has no wheel of it for this platform and Python (--arch, --python-version)"]
    if not clashes:
        return EXIT_NOT_CHECKED, {"status": "not checked", "why": f"pip exit {run.returncode}"}, [
            f"NOT CHECKED: pip failed (exit {run.returncode}) with no resolution conflict in its output ({head}); "
            "its output ends:", *run.output.splitlines()[-12:]]
    record = {"status": "conflict", "cannot_install": cannot, "wall_s": round(run.wall_s, 1), "pip": run.pip_version,
              "clashes": [{"package": c.package, "demands": c.demands, "no_distribution": c.no_distribution,
                           "available": c.available} for c in clashes]}
    lines = [f"DOES NOT RESOLVE ({head})" + (f": {cannot}: conflicting dependencies" if cannot else ""),
             *(f"  {c.line()}" for c in clashes)]
    return EXIT_CONFLICT, record, lines


def _resolved(run: PipRun, head: str) -> tuple[int, dict, list[str]]:
    """The verdict of a resolution pip finished: the versions that decide serving."""
    try:
        versions, cuda = key_versions(run.report), torch_cuda(run.report)
    except (ValueError, KeyError, TypeError) as e:  # a report format this script does not read
        return EXIT_NOT_CHECKED, {"status": "not checked", "why": f"pip's report: {e}"}, [
            f"NOT CHECKED: pip resolved, but its --report is not one this script reads ({head}): {e}"]
    record = {"status": "resolves", "packages": len(run.report["install"]), "versions": versions,
              "torch_cuda": cuda, "wall_s": round(run.wall_s, 1), "pip": run.pip_version}
    lines = [f"RESOLVES: {len(run.report['install'])} packages ({head})"]
    width = max(map(len, versions), default=0)
    for name, version in versions.items():
        built = f"  (built for CUDA {cuda})" if name == "torch" and cuda else ""
        lines.append(f"  {name:<{width}}  {version}{built}")
    return EXIT_RESOLVES, record, lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-r", "--requirements", type=Path, action="append",
                   help=f"requirements file (repeatable; default {DEFAULT_REQUIREMENTS.relative_to(REPO)})")
    p.add_argument("-c", "--constraint", type=Path, action="append", default=[],
                   help="constraints file (repeatable): does the environment resolve within these pins too?")
    p.add_argument("--python-version", default="3.11", help="the serving Python's version (default 3.11)")
    p.add_argument("--glibc", default="2.35", help="the host's glibc (default 2.35: Ubuntu 22.04, the base of "
                   "NVIDIA's CUDA images)")
    p.add_argument("--arch", default="x86_64", choices=("x86_64", "aarch64"))
    p.add_argument("--timeout", type=float, default=900, help="deadline for pip in seconds (default 900)")
    p.add_argument("--no-pip-config", action="store_true",
                   help="ignore pip's configuration files and index variables (this machine's mirrors, "
                        "find-links, constraints): resolve from pip's default index alone")
    p.add_argument("--keep", type=Path, help="folder to keep pip's report, its output and the summary in")
    return p.parse_args(argv)


def _bad_input(args: argparse.Namespace) -> str | None:
    for path in [*args.requirements, *args.constraint]:
        if not path.is_file():
            return f"{path}: no such file (expected a requirements or constraints file, such as " \
                   f"{DEFAULT_REQUIREMENTS.relative_to(REPO)})"
    if not re.fullmatch(r"3\.\d+", args.python_version):
        return f"--python-version {args.python_version!r}: expected major.minor, such as 3.11"
    try:
        platform_tags(args.glibc, args.arch)
    except ValueError as e:
        return str(e)
    return None


def _keep(folder: Path, run: PipRun, record: dict) -> None:
    sys.path.insert(0, str(REPO))  # the script runs from the checkout, quantlab beside it
    from quantlab.core.fsutil import write_json_atomic, write_text_atomic

    if run.report is not None:
        write_json_atomic(folder / "pip-report.json", run.report)
    write_text_atomic(folder / "pip-output.txt", run.output)
    write_json_atomic(folder / "summary.json", record)


def _from_repo(path: Path) -> Path:
    """The path as pip, run from the checkout, is given it: relative there when inside it
    (so pip's messages name requirements/serve-cuda.txt, not this machine's folders)."""
    full = path.resolve()
    return full.relative_to(REPO) if full.is_relative_to(REPO) else full


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.requirements = args.requirements or [DEFAULT_REQUIREMENTS]
    if problem := _bad_input(args):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args.requirements = [_from_repo(r) for r in args.requirements]
    args.constraint = [_from_repo(c) for c in args.constraint]
    where = (f"{', '.join(str(r) for r in args.requirements)}"
             + "".join(f" -c {c}" for c in args.constraint)
             + f"; CPython {args.python_version}, glibc {args.glibc} {args.arch}"
             + ("; pip's configuration ignored" if args.no_pip_config else ""))
    with tempfile.TemporaryDirectory(prefix="cuda-env-check-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = pip_command(sys.executable, args.requirements, args.constraint, python_version=args.python_version,
                          glibc=args.glibc, arch=args.arch, target=Path(tmp) / "target", report=report)
        print(f"resolving {where} with pip (dry run, nothing installed) ...", flush=True)
        env = pip_environment(dict(os.environ), own_config=not args.no_pip_config)
        run = run_pip(cmd, report, args.timeout, env)
    code, record, lines = summarize(run, where=where)
    print("\n".join(lines))
    if args.keep:
        _keep(args.keep, run, {**record, "command": cmd})
    return code


if __name__ == "__main__":
    sys.exit(main())
