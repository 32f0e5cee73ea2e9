"""The registration statement (release/registration.py): written and signed before any
engine, kept or registered anew on a resume, refused when gates change after their
evidence, and checked by verify against the gate set the decision was made under."""

import json

import pytest

from quantlab.core.errors import RecipeError
from quantlab.core.run import RunDir, StageRecord, now_iso
from quantlab.core.shipped import RECIPES
from quantlab.pipeline.context import RunContext
from quantlab.recipe.family import Family
from quantlab.recipe.file import LoadedRecipe, load_recipe
from quantlab.release.manifest import generate_keypair
from quantlab.core.layout import REGISTRATION_FILE, REGISTRATION_SIG
from quantlab.release.verify import verify_registration
from quantlab.release.registration import (REGISTRATION_DIR, copy_into,
                                           register)


@pytest.fixture
def keys(tmp_path):
    generate_keypair(tmp_path / "keys" / "k.pem", tmp_path / "keys" / "k.pub.pem")
    return tmp_path / "keys"


def ctx_for(tmp_path, keys, edit=None, run=None, family=None):
    loaded = load_recipe(RECIPES / "gptq-w4a16.yaml")
    data = loaded.recipe.model_dump(mode="python")
    data["signing"] = {"private_key": str(keys / "k.pem")}
    if edit:
        edit(data)
    loaded = LoadedRecipe(recipe=type(loaded.recipe).model_validate(data), path=loaded.path)
    run = run or RunDir.create(loaded, tmp_path / "runs")
    return RunContext(loaded, run, progress=lambda *_: None, family=family)


def done(ctx, *names):
    for name in names:
        ctx.run.record.stages[name] = StageRecord(name=name, status="ok", started_at=now_iso(),
                                                  finished_at=now_iso(), duration_s=1.0, inputs_sha256="x")


def test_registered_signed_then_kept_then_anew_or_refused(tmp_path, keys):
    ctx = ctx_for(tmp_path, keys, family=Family(size=3, members=("a", "b", "c")))
    held = register(ctx)
    statement = json.loads((ctx.run.path / REGISTRATION_DIR / REGISTRATION_FILE).read_text())
    assert held["signed"] and held["signing_method"] == "key" and held["registrations"] == 1
    assert statement["gates"]["family"]["size"] == 3
    assert statement["gates"]["quality"]["gates"]["confidence"] == pytest.approx(1 - 0.05 / 3)  # as judged
    assert [s["name"] for s in statement["data"]["suites"]] == ["default"] and statement["data"]["suites"][0]["sha256"]
    assert statement["data"]["seeds"]["quality"] == 1234 and statement["data"]["files"]  # the calibration files
    ctx.run.record.registration = held
    assert register(ctx) == held  # the same gate set: the same registration

    # performance's gates edited after its stage ran: measured again, so registered anew (the first kept)
    done(ctx, "quantize", "serve", "quality", "performance")
    def faster(d):
        d["performance"]["gates"]["min_throughput_ratio"] = 0.9
    again = ctx_for(tmp_path, keys, faster, run=ctx.run, family=Family(size=3, members=("a", "b", "c")))
    anew = register(again)
    assert anew["registrations"] == 2 and anew["gates_sha256"] != held["gates_sha256"]
    assert (ctx.run.path / f"{REGISTRATION_DIR}.1" / REGISTRATION_FILE).is_file()

    # serve.allow_kernels widened after the serve stage's evidence: refused (vLLM picks the same kernels for the
    # same checkpoint and host on a re-run), naming the field
    def wider(d):
        d["serve"]["allow_kernels"] = ["ExllamaLinearKernel"]
    with pytest.raises(RecipeError, match="serve.allow_kernels changed after this run's evidence") as err:
        register(ctx_for(tmp_path, keys, wider, run=ctx.run, family=Family(size=3, members=("a", "b", "c"))))
    assert err.value.field == "serve.allow_kernels"

    # quality's margin or the policy edited after quality's evidence: refused, naming the field
    def looser(d):
        d["quality"]["gates"]["non_inferiority_min_margin"] = 0.2
    with pytest.raises(RecipeError, match="quality changed after this run's evidence") as err:
        register(ctx_for(tmp_path, keys, looser, run=ctx.run, family=Family(size=3, members=("a", "b", "c"))))
    assert err.value.field == "quality"
    def warn_all(d):
        d["release"]["policy"] = {"not_shown": "warn"}
    with pytest.raises(RecipeError, match="policy changed") as err:
        register(ctx_for(tmp_path, keys, warn_all, run=ctx.run, family=Family(size=3, members=("a", "b", "c"))))
    assert err.value.field == "release.policy"
    # a smaller family is a change of the policy (the alpha's split) too
    with pytest.raises(RecipeError, match="policy"):
        register(ctx_for(tmp_path, keys, faster, run=ctx.run))


def test_a_widened_allow_kernels_before_the_serve_stage_ran_is_registered_anew(tmp_path, keys):
    ctx = ctx_for(tmp_path, keys)
    ctx.run.record.registration = held = register(ctx)
    done(ctx, "quantize")
    def wider(d):
        d["serve"]["allow_kernels"] = ["ExllamaLinearKernel"]
    anew = register(ctx_for(tmp_path, keys, wider, run=ctx.run))
    assert anew["registrations"] == 2 and anew["gates_sha256"] != held["gates_sha256"]


def test_verify_checks_the_statement_its_signature_and_the_gates_decided_under(tmp_path, keys):
    ctx = ctx_for(tmp_path, keys)
    ctx.run.record.registration = register(ctx)
    folder = tmp_path / "released"
    folder.mkdir()
    recorded = copy_into(ctx, folder)
    assert (folder / REGISTRATION_FILE).is_file() and (folder / REGISTRATION_SIG).is_file()
    pub = keys / "k.pub.pem"
    assert verify_registration(folder, recorded, public_key=pub) == []
    assert verify_registration(folder, None, public_key=pub) == []  # a manifest from before registrations

    other = {**recorded, "gates_sha256_at_decision": "0" * 64}
    assert any("gate set other than the registered one" in p for p in verify_registration(folder, other,
                                                                                        public_key=pub))
    generate_keypair(tmp_path / "k2.pem", tmp_path / "k2.pub.pem")
    assert any(p.startswith("registration: signature check failed")
               for p in verify_registration(folder, recorded, public_key=tmp_path / "k2.pub.pem"))
    text = (folder / REGISTRATION_FILE).read_text()
    (folder / REGISTRATION_FILE).write_text(text.replace('"non_inferiority_min_margin": 0.05',
                                                         '"non_inferiority_min_margin": 0.5'))
    problems = verify_registration(folder, recorded, public_key=pub)
    assert any("not the registration the manifest records" in p for p in problems)
    assert any(p.startswith("registration: signature check failed") for p in problems)
