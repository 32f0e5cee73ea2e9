"""scripts/check_cuda_env.py's pure parts on pip's real output (tests/data/cuda_env, each
file made by the script's own pip run: see its README.md): the versions read from a
--report, the clashes condensed from a failed resolution, the platform tags and pip's
environment; the deadline and bad input for real. No index is reached here."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "cuda_env"


def _load_script():
    spec = importlib.util.spec_from_file_location("check_cuda_env", REPO / "scripts" / "check_cuda_env.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_cuda_env"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


check = _load_script()
REPORT = json.loads((DATA / "pip23-report-serve-cuda.json").read_text())


def test_the_report_gives_the_versions_that_decide_serving():
    assert check.key_versions(REPORT) == {
        "vllm": "0.33.0", "torch": "2.14.0", "torchvision": "0.29.0", "torchaudio": "2.11.0",
        "compressed-tensors": "0.17.0", "transformers": "5.20.2", "triton": "3.8.0",
        "flashinfer-python": "0.7.2.post1", "ray": "2.60.0", "cuda-toolkit": "13.0.3.0",
        "nvidia-cuda-runtime": "13.0.96", "nvidia-cudnn-cu13": "9.24.0.43", "nvidia-nccl-cu13": "2.30.7"}
    assert check.torch_cuda(REPORT) == "13.0"  # from torch's own cuda-toolkit[...]==13.0.3 pin
    versions = check.resolved_versions(REPORT)
    assert len(versions) == 200 and versions["llguidance"] == "1.7.6"
    # the CUDA 12 wheels' way of pinning the runtime is read the same
    cu12 = {"version": "1", "install": [{"metadata": {"name": "torch", "version": "2.9.0", "requires_dist": [
        'nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"']}}]}
    assert check.torch_cuda(cu12) == "12.8"


def test_a_file_that_is_not_a_pip_report_is_refused():
    with pytest.raises(ValueError, match="not a pip installation report of format 1"):
        check.resolved_versions({"version": "2", "install": []})
    with pytest.raises(ValueError, match="not a pip installation report"):
        check.resolved_versions({"packages": []})


@pytest.mark.parametrize("name, cannot, line", [
    ("pip23-conflict-quantize-pins.txt", "-r requirements/serve-cuda.txt (line 2)",
     "lark: vllm 0.33.0 depends on lark==1.2.2  <->  constraint lark==1.3.1"),
    ("pip26-conflict-quantize-pins.txt", "-r requirements/serve-cuda.txt (line 2)",
     "lark: vllm 0.33.0 depends on lark==1.2.2  <->  constraint lark==1.3.1"),
    ("pip23-conflict-torch-pin.txt", "-r requirements/serve-cuda.txt (line 2) and torch==2.13.0",
     "torch: requested torch==2.13.0  <->  vllm 0.33.0 depends on torch==2.14.0"),
])
def test_a_conflict_is_condensed_to_which_requirement_against_which(name, cannot, line):
    clashes, named = check.parse_failure((DATA / name).read_text())
    assert named == cannot and [c.line() for c in clashes] == [line]
    assert not clashes[0].no_distribution


def test_a_package_with_no_wheel_for_the_platform_is_named_with_who_asked_for_it():
    [clash], cannot = check.parse_failure((DATA / "pip23-no-wheel-glibc-2.28.txt").read_text())
    assert cannot is None and clash.no_distribution
    assert clash.demands == [("vllm", "llguidance<1.8.0,>=1.7.0")]  # the environment markers dropped
    assert clash.available == "..., 1.4.0, 1.5.0, 1.5.1, 1.6.0, 1.6.1"
    assert clash.line().startswith("llguidance: no wheel for this platform and Python meets "
                                   "llguidance<1.8.0,>=1.7.0 (required by vllm)")


def run_of(output: str, *, code: int | None = 1, report: dict | None = None):
    return check.PipRun(code, output, report, 12.0, "23.2.1")


def test_the_verdict_and_its_exit_code():
    code, record, lines = check.summarize(run_of("", code=0, report=REPORT), where="w")
    assert code == 0 and record["status"] == "resolves" and record["torch_cuda"] == "13.0"
    assert lines[0] == "RESOLVES: 200 packages (w; pip 23.2.1; 12.0 s)"
    assert "  torch                2.14.0  (built for CUDA 13.0)" in lines
    code, record, lines = check.summarize(run_of((DATA / "pip23-conflict-torch-pin.txt").read_text()), where="w")
    assert code == 1 and record["clashes"][0]["package"] == "torch" and "torch==2.13.0" in lines[0]
    code, _, lines = check.summarize(run_of((DATA / "pip23-no-wheel-glibc-2.28.txt").read_text()), where="w")
    assert code == 1 and lines[1].startswith("  llguidance: no wheel")


@pytest.mark.parametrize("name", ["pip23-index-unreachable.txt", "pip23-index-unreachable-no-retries.txt"])
def test_an_unreachable_index_is_not_taken_for_a_conflict(name):
    code, record, lines = check.summarize(run_of((DATA / name).read_text()), where="w")
    assert code == 3 and record["status"] == "not checked" and lines[0].startswith("NOT CHECKED")


def test_other_failures_and_the_deadline_are_not_checked():
    code, record, _ = check.summarize(run_of("ERROR: unexpected", code=2), where="w")
    assert (code, record["why"]) == (3, "pip exit 2")
    code, record, lines = check.summarize(run_of("", code=None), where="w")
    assert (code, record["why"]) == (3, "deadline") and "raise --timeout" in lines[0]
    code, record, _ = check.summarize(run_of("", code=0, report={"version": "2", "install": []}), where="w")
    assert code == 3 and "not a pip installation report of format 1" in record["why"]


def test_pip_is_stopped_at_its_deadline(tmp_path):
    run = check.run_pip([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                        tmp_path / "report.json", 1.0, dict(os.environ))
    assert run.returncode is None and run.wall_s < 30 and "started" in run.output


def test_platform_tags_are_every_manylinux_the_host_accepts():
    tags = check.platform_tags("2.35", "x86_64")
    assert tags[0] == "manylinux_2_35_x86_64" and "manylinux_2_17_x86_64" in tags
    assert tags[-4:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    assert len(tags) == 35 - 17 + 1 + 4
    for bad in ("2.16", "2", "glibc-2.35"):
        with pytest.raises(ValueError, match="expected a glibc version 2.17 or newer"):
            check.platform_tags(bad, "x86_64")


def test_the_pip_command_is_a_dry_run_for_the_target(tmp_path):
    cmd = check.pip_command("py", [Path("requirements/serve-cuda.txt")], [Path("c.txt")], python_version="3.11",
                            glibc="2.31", arch="aarch64", target=tmp_path / "t", report=tmp_path / "r.json")
    assert cmd[:6] == ["py", "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    assert "--only-binary=:all:" in cmd and cmd[cmd.index("--abi") + 1] == "cp311"
    assert cmd[cmd.index("--platform") + 1] == "manylinux_2_31_aarch64"
    assert cmd[-4:] == ["-r", "requirements/serve-cuda.txt", "-c", "c.txt"]


def test_pip_configuration_kept_or_set_aside():
    environ = {"PIP_FIND_LINKS": "/wheels", "PIP_EXTRA_INDEX_URL": "file:///mirror", "PIP_CERT": "ca.pem",
               "PATH": "/bin"}
    assert check.pip_environment(environ, own_config=True) == environ
    bare = check.pip_environment(environ, own_config=False)
    assert bare == {"PIP_CERT": "ca.pem", "PATH": "/bin", "PIP_CONFIG_FILE": os.devnull}


def test_bad_input_exits_2_before_pip_runs(tmp_path, capsys):
    assert check.main(["-r", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: no such file" in capsys.readouterr().err
    assert check.main(["--glibc", "2.5"]) == 2
    assert check.main(["--python-version", "three"]) == 2
    assert "expected major.minor" in capsys.readouterr().err
