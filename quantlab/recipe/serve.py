"""The recipe's serve section: the primary target, extra serve targets, engine arguments."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


PRIMARY_TARGET = "primary"  # the serve section's own target, in decisions and reports
# a kernel class name as vLLM's log names it (serving/engine_log.KERNEL)
KERNEL_NAME = re.compile(r"[A-Za-z0-9_]*Kernel[A-Za-z0-9_]*")


def _kernel_name(name: str) -> str:
    if not KERNEL_NAME.fullmatch(name):
        raise ValueError(f"'{name}' is not a kernel class name as vLLM's log names it (e.g. MarlinLinearKernel, "
                         "MarlinFP8ScaledMMLinearKernel)")
    return name


AllowedKernels = list[Annotated[str, AfterValidator(_kernel_name)]]
TARGET_OVERRIDES = ("mode", "device", "python", "command", "endpoint", "candidate_endpoint", "served_model_name",
                    "candidate_served_model_name", "allow_same_endpoint", "startup_timeout_s", "cpu_kv_cache_space_gib",
                    "api_key_env")

# vLLM options quantlab sets itself (or must not be set at all), with the recipe field to use
# instead. vLLM's parser takes any unambiguous prefix of an option (argparse's allow_abbrev),
# so a key is refused here when it is one of these or a prefix of one; the preflight resolves
# every key with the serving environment's own parser (serving/engine_args.py).
QUANTLAB_OPTIONS = {
    "--host": "serve.host (with serve.expose: true for an address other hosts can reach)",
    "--port": "serve.port",
    "--api-key": "nothing: quantlab gives every server it starts a random key of its own for the run",
    "--trust-remote-code": "model.trust_remote_code (quantlab passes it to the servers)",
    "--no-trust-remote-code": "model.trust_remote_code (quantlab passes it to the servers)",
    "--served-model-name": "serve.served_model_name / candidate_served_model_name (an external server's name); "
                           "a server quantlab starts serves under a name of its own",
    "--config": "serve.engine_args itself (one key per option); a config file would set options unseen",
    "--model": "model.source (the baseline) or the run's checkpoint (the candidate)",
}
ENGINE_ARG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*\+?")
QUANTLAB_ENV = {"VLLM_API_KEY": "quantlab gives every server it starts a random API key through it; for a server "
                "it does not start, name the variable holding that server's key in serve.api_key_env"}


def option_of(key: str) -> str:
    """The command-line option an engine_args key becomes, as vLLM's parser reads it: dashes
    for underscores up to the first dot (a dotted key sets a field of a JSON option)."""
    return "--" + key.split(".", 1)[0].rstrip("+").replace("_", "-")


def quantlab_option(key: str) -> str | None:
    """The option quantlab sets itself that this key names or abbreviates (None: none)."""
    flag = option_of(key)
    return next((o for o in QUANTLAB_OPTIONS if o.startswith(flag)), None)


def check_engine_arg_keys(args: dict, field: str = "serve.engine_args") -> None:
    """ValueError for a key that is not an option name, or that names (or abbreviates) an
    option quantlab sets itself."""
    for key in args:
        if not ENGINE_ARG_KEY.fullmatch(str(key)):
            raise ValueError(f"{field}.{key}: not an engine argument name; write vLLM's option without the leading "
                             "dashes, one key per option, no '=' or spaces (max_model_len: 2048)")
        option = quantlab_option(key)
        if option is not None:
            said = f"{option} is" if option == option_of(key) else \
                f"vLLM would read {option_of(key)} as {option} (any unambiguous prefix of an option is that option),"
            raise ValueError(f"{field}.{key}: {said} an option quantlab sets itself; use {QUANTLAB_OPTIONS[option]}")


class ServeTarget(_Strict):
    """One more place the release is meant for (another device, engine build or endpoint).
    Unset fields are the serve section's; engine_args and env are merged over it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$", description="Short name used in "
                      "reports, decisions and server log names.")
    required: bool = Field(True, description="The exit code follows this target's decision. An optional "
                           "target that cannot serve the scheme, or does not start, is recorded as blocked.")
    roles: list[Literal["baseline", "candidate"]] = Field(
        default_factory=lambda: ["baseline", "candidate"], min_length=1,
        description="What is served on this target. With the baseline too, the candidate's mismatch "
        "against the primary target is judged against the baseline's (hardware changes greedy text too).")
    max_mismatch_excess: float | None = Field(
        0.25, ge=0, le=1, description="Candidate's greedy mismatch rate against the primary target minus the "
        "baseline's (needs both roles; otherwise inconclusive).")
    max_mismatch: float | None = Field(None, ge=0, le=1, description="Candidate's greedy mismatch rate against "
                                       "the primary target, absolute.")
    mode: Literal["launch", "command", "endpoint"] | None = None
    device: Literal["auto", "cpu", "cuda"] | None = None
    python: str | None = None
    command: list[str] | None = None
    endpoint: str | None = None
    candidate_endpoint: str | None = None
    served_model_name: str | None = None
    candidate_served_model_name: str | None = None
    allow_same_endpoint: bool | None = None
    startup_timeout_s: float | None = Field(None, gt=0, le=7200)
    cpu_kv_cache_space_gib: float | None = Field(None, gt=0)
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    engine_args: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="Merged over serve.engine_args (null removes a key).")
    env: dict[str, str] = Field(default_factory=dict, description="Merged over serve.env.")
    allow_kernels: AllowedKernels = Field(default_factory=list, description="Added to serve.allow_kernels on "
                                          "this target.")


class ServeSpec(_Strict):
    """How to reach a vLLM engine. Baseline and candidate get identical engine args."""

    mode: Literal["launch", "command", "endpoint"] = Field(
        "launch",
        description="launch: start vLLM from the serving environment; command: start it with "
        "'command' (a container, a cluster job); endpoint: use an already running server.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Target device; auto detects a GPU.")
    python: str | None = Field(
        None, description="Python of the serving environment (default: .venv-vllm/bin/python, "
        "or $QUANTLAB_VLLM_PYTHON).",
    )
    command: list[str] | None = Field(
        None, description="Launch command (mode 'command'), one list item per argument, with "
        "placeholders {model}, {port}, {host}, {served_model_name}; engine_args are appended.",
    )
    endpoint: str | None = Field(None, description="Base URL of a running server serving the baseline "
                                 "(mode 'endpoint').")
    candidate_endpoint: str | None = Field(None, description="Mode 'endpoint': base URL serving the candidate.")
    served_model_name: str | None = Field(
        None, description="Model name the external baseline server serves (mode 'endpoint', or a 'command' "
        "without {served_model_name}). Unset: the one model the server lists.")
    candidate_served_model_name: str | None = Field(
        None, description="Model name the external candidate server serves; unset: the one model it lists.")
    allow_same_endpoint: bool = Field(
        False, description="Mode 'endpoint': allow baseline and candidate to be the same server and model "
        "(a self-comparison, e.g. to check that the gates pass on identical models).")
    host: str = Field("127.0.0.1", description="Interface a launched server binds to. An address other hosts can "
                      "reach (0.0.0.0, a LAN address) needs serve.expose: true.")
    expose: bool = Field(False, description="Allow serve.host to be an address other hosts can reach: the servers "
                         "are then open to the network (each still needs the run's API key). Said in the dry run "
                         "and the report.")
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Modes endpoint and command: the environment "
        "variable holding the API key of the server quantlab does not start itself; its value is read when the "
        "run starts and never recorded. Unset: an endpoint is sent no key, a command's server gets quantlab's own "
        "random key in VLLM_API_KEY (pass it on, e.g. docker run -e VLLM_API_KEY).")
    candidate_api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Mode endpoint: the environment variable holding "
        "the candidate endpoint's key where it is not the baseline's (two deployments, two keys); unset: "
        "api_key_env serves both.")
    port: int | None = Field(None, ge=1, le=65535, description="Port for a launched server (default: a free one).")
    startup_timeout_s: float = Field(900, gt=0, le=7200, description="Deadline for /health to answer 200.")
    shutdown_timeout_s: float = Field(30, gt=0, le=600, description="Grace period after SIGTERM before SIGKILL.")
    engine_args: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict,
        description="vLLM server arguments without the leading dashes (max_model_len: 2048, "
        "kv_cache_dtype: fp8, tensor_parallel_size: 2, ...). true -> a bare flag, false/null -> omitted.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="dtype both servers compute in. auto: model.dtype, except on a CPU whose 16-bit "
        "matmul measures slower than float32 (torch emulates bf16 without AVX-512 BF16/AMX): float32 there. "
        "engine_args.dtype, if set, wins.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the server process.")
    cpu_kv_cache_space_gib: float = Field(
        1, gt=0, description="CPU only: KV cache size (VLLM_CPU_KVCACHE_SPACE) in GiB.")
    side_by_side: bool = Field(
        False, description="Serve baseline and candidate at the same time (needs memory for both).")
    allow_kernels: AllowedKernels = Field(
        default_factory=list, description="Linear kernel class names (as vLLM's log names them, e.g. "
        "MarlinFP8ScaledMMLinearKernel) the serve.kernel_path gate accepts beside the ones the scheme should get "
        "on the host: a fallback you have decided to ship.")
    targets: list[ServeTarget] = Field(
        default_factory=list, description="More serve targets (devices, engine builds, endpoints) beside this "
        "primary one: each serves the same checkpoint, its greedy outputs are compared with the primary "
        "target's, and it gets its own release decision. Quality and performance are measured on the primary.")

    @model_validator(mode="after")
    def _mode_fields(self) -> "ServeSpec":
        if self.mode == "command" and not self.command:
            raise ValueError("mode 'command' needs 'command' (a list, e.g. [docker, run, ..., '{model}'])")
        if self.mode == "endpoint" and not self.endpoint:
            raise ValueError("mode 'endpoint' needs 'endpoint' (e.g. http://127.0.0.1:8000)")
        if self.mode == "endpoint" and not self.allow_same_endpoint:
            same_url = (self.candidate_endpoint or self.endpoint).rstrip("/") == self.endpoint.rstrip("/")
            same_name = self.candidate_served_model_name == self.served_model_name
            if same_url and same_name:
                raise ValueError(
                    "baseline and candidate would be the same server and model: set 'candidate_endpoint' "
                    "(or a different 'candidate_served_model_name'), or 'allow_same_endpoint: true' if a "
                    "self-comparison is intended")
        if self.mode != "endpoint":
            for key in ("endpoint", "candidate_endpoint"):
                if getattr(self, key):
                    raise ValueError(f"'{key}' is only used with mode 'endpoint'")
        if self.mode != "command" and self.command:
            raise ValueError("'command' is only used with mode 'command'")
        check_engine_arg_keys(self.engine_args)
        for name, why in QUANTLAB_ENV.items():
            if name in self.env:
                raise ValueError(f"serve.env.{name}: {why}")
        if self.candidate_api_key_env is not None and self.mode != "endpoint":
            raise ValueError("serve.candidate_api_key_env names the candidate endpoint's key: it is only used with "
                             "mode 'endpoint'")
        if self.api_key_env is not None and self.mode == "launch":
            raise ValueError("serve.api_key_env names the key of a server quantlab does not start (mode endpoint or "
                             "command); a launched server gets a random key of quantlab's own: remove it")
        names = [t.name for t in self.targets]
        for i, t in enumerate(self.targets):
            if t.name == PRIMARY_TARGET or names.count(t.name) > 1:
                raise ValueError(f"targets[{i}].name '{t.name}': target names must be unique and not "
                                 f"'{PRIMARY_TARGET}' (the serve section itself)")
            try:
                self.for_target(t)
            except ValidationError as err:
                first = err.errors()[0]
                raise ValueError(f"targets[{i}] ('{t.name}'), once merged over the serve section: "
                                 f"{first['msg'].removeprefix('Value error, ')}") from None
        return self

    @property
    def optional_targets(self) -> set[str]:
        """Names of the serve targets whose decision does not decide the run (required: false)."""
        return {t.name for t in self.targets if not t.required}

    def for_target(self, target: "ServeTarget") -> "ServeSpec":
        """The serve section as this target sees it: its overrides applied, engine_args and
        env merged (a null engine arg removes the key), no further targets."""
        data = self.model_dump(exclude={"targets"})
        for key in TARGET_OVERRIDES:
            value = getattr(target, key)
            if value is not None:
                data[key] = value
        if target.mode is not None and target.mode != self.mode:
            for key in ("endpoint", "candidate_endpoint", "command"):  # the primary's mode-only fields
                if getattr(target, key) is None:
                    data[key] = None
            if target.mode == "launch" and target.api_key_env is None:  # a launched server's key is quantlab's
                data["api_key_env"] = None
        if len(target.roles) == 1:  # one role served there: no baseline/candidate pair to confuse
            data["allow_same_endpoint"] = True
        args = {**self.engine_args, **target.engine_args}
        data["engine_args"] = {k: v for k, v in args.items() if v is not None}
        data["env"] = {**self.env, **target.env}
        data["allow_kernels"] = self.allow_kernels + [k for k in target.allow_kernels if k not in self.allow_kernels]
        return ServeSpec.model_validate(data)
