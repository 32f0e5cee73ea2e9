"""The engine half of a run: the baseline model, the serving environment's probe, the
serving plan and the pool of servers, each resolved once per run and shared by the
stages. The run loop's RunContext is one; stages see it through core.stage_context.StageContext."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantlab.core.layout import CHECKPOINT_DIR, SERVE_LOG_DIR
from quantlab.core.progress import Progress
from quantlab.core.run import RunDir
from quantlab.models.source import ResolvedModel, model_files_identity, resolve_recipe_model
from quantlab.recipe.family import Family, judged_at
from quantlab.recipe.file import LoadedRecipe, Recipe
from quantlab.recipe.serve import PRIMARY_TARGET
from quantlab.recipe.stream import StreamDecision


@dataclass
class EngineSession:
    loaded: LoadedRecipe
    run: RunDir
    progress: Progress = print
    verbose: bool = False  # engines print to the terminal instead of log files in the run folder
    import_from: Path | None = None  # quantlab validate: the existing checkpoint to validate
    memo: dict[str, Any] = field(default_factory=dict)  # core.stage_context.once: built once per run
    # several candidates judged on the same items: the recipe's confidences adjusted for them (recipe/family.py)
    family: Family | None = None
    # decisions against the same baseline answers: this run's place in their stream (recipe/stream.py)
    stream: StreamDecision | None = None
    _baseline: ResolvedModel | None = None
    _probe: dict[str, Any] | None = None
    _plan: Any = None  # ServingPlan, built once
    _pool: Any = None  # serving.pool.EnginePool, started on first use
    _target_plans: Any = None  # {name: TargetPlan} for serve.targets, built once
    _probes: dict[tuple, dict[str, Any]] = field(default_factory=dict)
    _baseline_id: dict[str, Any] | None = None  # per serving env of the extra targets

    @property
    def recipe(self) -> Recipe:
        """The recipe the stages judge by: the file's, or its copy at the stream's share of
        its alpha divided over its family (every interval gate's 1 - c times the share)."""
        share = (self.stream.share if self.stream is not None else 1.0) / (self.family.size if self.family else 1)
        if share == 1:
            return self.loaded.recipe
        key = ("judged-recipe", share)
        if key not in self.memo:
            self.memo[key] = judged_at(self.loaded.recipe, share)
        return self.memo[key]

    @property
    def checkpoint_dir(self) -> Path:
        return self.run.path / CHECKPOINT_DIR

    def baseline_model(self) -> ResolvedModel:
        if self._baseline is None:
            self._baseline = resolve_recipe_model(self.loaded, progress=self.progress)
        return self._baseline

    def baseline_identity(self) -> dict[str, Any]:
        """What stands for the baseline's weights in cache keys (hashed once per run): its
        model files, or an external endpoint's URL and served name."""
        if self._baseline_id is None:
            # before the checkpoint exists (a dry run, the early cache check) the predicted plan
            # names the same baseline
            ready = self._plan is not None or (self.checkpoint_dir / "config.json").is_file()
            plan = self.serving_plan(predicted=not ready)
            target = plan.target("baseline")
            if plan.spec.mode == "endpoint" or target.model_dir is None:
                # quantlab cannot see an external server's weights: the endpoint and its model name stand for them
                self._baseline_id = {"endpoint": plan.endpoint_for("baseline"),
                                     "served_name": plan.spec.served_model_name}
            else:
                self._baseline_id = model_files_identity(Path(target.model_dir))
        return self._baseline_id

    def serving_probe(self) -> dict[str, Any]:
        """The serving environment's versions and hardware (probed once per run; an
        endpoint's hardware cannot be probed)."""
        if self._probe is None:
            from quantlab.serving.vllm_probe import probe_for

            self._probe = probe_for(self.recipe.serve)
        return self._probe

    def serving_plan(self, *, predicted: bool = False):
        """Targets, device, engine args and compatibility, checked before any server starts.
        predicted=True judges the scheme the recipe will export (the checkpoint may not exist yet)."""
        from quantlab.serving.plan import plan_serving, serve_targets

        if not predicted and self._plan is not None:
            return self._plan
        spec = self.recipe.serve
        targets = serve_targets(spec, baseline_dir=self.baseline_model().path, candidate_dir=self.checkpoint_dir)
        overrides = None
        if predicted:
            known, config = self.predicted_quant_config()
            overrides = {"candidate": config}
            if not known:  # a raw recipe: only the checkpoint will tell
                targets, overrides = [t for t in targets if t.role != "candidate"], {}
        plan = plan_serving(spec, targets, dtype=self.recipe.model.dtype, probe=self.serving_probe(),
                            quant_configs=overrides, trust_remote_code=self.recipe.model.trust_remote_code)
        if not predicted:
            self._plan = plan
        return plan

    def predicted_quant_config(self) -> tuple[bool, dict[str, Any] | None]:
        """(known, quantization_config) of the candidate before its folder is in the run:
        the config of the checkpoint `quantlab validate` was given (None: unquantized; the
        recipe's quantization section is not what is validated then), else the one the
        recipe will export (unknown for a raw recipe: only its checkpoint will tell)."""
        from quantlab.serving.compat import predict_quant_config
        from quantlab.quantize.checkpoint_config import read_quant_config

        if self.import_from is not None:
            return True, read_quant_config(self.import_from)
        config = predict_quant_config(self.recipe.quantization)
        return config is not None, config

    def target_plans(self, *, predicted: bool = False) -> dict[str, Any]:
        """serve.targets planned like the primary target (TargetPlan per name). A required
        target that cannot serve raises RecipeError; an optional one is marked unservable."""
        from quantlab.serving.vllm_probe import probe_for
        from quantlab.serving.plan import plan_extra_target

        if not predicted and self._target_plans is not None:
            return self._target_plans
        primary = self.recipe.serve
        overrides = None
        if predicted:
            known, scheme = self.predicted_quant_config()
            overrides = {"candidate": scheme} if known else {}
        plans = {}
        for t in primary.targets:
            spec = primary.for_target(t)
            key = (spec.mode, spec.python)
            if key == (primary.mode, primary.python):
                probe = self.serving_probe()
            else:
                if key not in self._probes:
                    self._probes[key] = probe_for(spec)
                probe = self._probes[key]
            plans[t.name] = plan_extra_target(primary, t, baseline_dir=self.baseline_model().path,
                                              candidate_dir=self.checkpoint_dir, dtype=self.recipe.model.dtype,
                                              probe=probe, quant_configs=overrides,
                                              trust_remote_code=self.recipe.model.trust_remote_code)
        if not predicted:
            self._target_plans = plans
        return plans

    def served_max_model_len(self) -> int | None:
        """The context length the servers really use (the serve stage's facts; the
        smallest if they differ), else the recipe's explicit max_model_len, else None."""
        from quantlab.core.results import ServeResult

        serve = self.run.record.result("serve")
        if isinstance(serve, ServeResult):
            lens = [e.max_model_len for e in serve.engines.values() if e.max_model_len]
            if lens:
                return min(lens)
        return self.recipe_max_model_len()

    def recipe_max_model_len(self) -> int | None:
        """serve.engine_args.max_model_len when the recipe sets it (known before any server runs)."""
        explicit = self.recipe.serve.engine_args.get("max_model_len")
        return explicit if isinstance(explicit, int) else None

    def engine(self, role: str, target: str = PRIMARY_TARGET):
        """The running server for a role on a serve target (started on first use, kept
        for later stages)."""
        self._ensure_pool()
        if target != PRIMARY_TARGET:
            if target not in self._pool.plans:
                self._pool.add_target(self.target_plans()[target].plan)
            return self._pool.get(role, target)
        server = self._pool.get(role)
        # an endpoint's served name is discovered by the serve stage; a server got again
        # later (one-at-a-time serving restarts it) carries the default until told. A server
        # quantlab starts serves the name its plan gave it (a resumed run's differs from the record's).
        facts = getattr(self.run.record.result("serve"), "engines", {}).get(role)
        if facts is not None and not self._pool.plans[PRIMARY_TARGET].target(role).name_is_explicit:
            server.served_name = facts.served_model_name
        return server

    def start_engines(self, roles: list[str]) -> None:
        """Start the primary target's servers for these roles together when they may run
        side by side (measured on 2 cores: 62 s for two starts at once against 71.5 s one
        after the other); otherwise they start one by one as they are asked for."""
        self._ensure_pool()
        if self._pool.side_by_side and len(roles) > 1:
            self._pool.start([(PRIMARY_TARGET, r) for r in roles])

    def _ensure_pool(self) -> None:
        if self._pool is None:
            from quantlab.serving.pool import EnginePool

            self._pool = EnginePool(self.serving_plan(), log_dir=self.run.path / SERVE_LOG_DIR,
                                    progress=self.progress)

    def adopt_engine(self, role: str, server: Any, *, owned: bool) -> None:
        """A server started by someone else for this run's role (a comparison starts the
        shared baseline and every candidate together); one not owned outlives this run's
        close_engines()."""
        self._ensure_pool()
        self._pool.adopt(role, server, owned=owned)

    def engine_if_running(self, role: str, target: str = PRIMARY_TARGET):
        """The server for a role if one is up (never starts one)."""
        return self._pool.running_server(role, target) if self._pool is not None else None

    def running_engines(self) -> list[str]:
        return self._pool.running() if self._pool is not None else []

    def running_engine_keys(self) -> list[tuple[str, str]]:
        """(serve target, role) of each running server."""
        return self._pool.running_keys() if self._pool is not None else []

    def stop_engine(self, role: str, target: str = PRIMARY_TARGET) -> None:
        if self._pool is not None:
            self._pool.stop(role, target)

    def close_engines(self) -> None:
        if self._pool is not None:
            self._pool.close()
