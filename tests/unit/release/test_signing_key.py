"""Which key signs (release/signing_key.py): the local development key is created once,
whole, mode 0600 in a folder of its owner's, in the per-user config folder (not the cache,
which may be shared); one that cannot be created is a clear error; a key file another user made, one others can
read or write, or a planted link is refused (exit 2) instead of used."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from quantlab.core.errors import RecipeError
from quantlab.core.run import RunDir
from quantlab.core.shipped import RECIPES
from quantlab.pipeline.context import RunContext
from quantlab.recipe.file import LoadedRecipe, load_recipe
from quantlab.release.manifest import generate_keypair, public_key_fingerprint, public_pem_of
from quantlab.release.signing_key import local_key_path, local_public_key, signing_key


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A config folder (where the key lives) and a cache folder of this test's own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("QUANTLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def ctx_for(tmp_path, private_key=None, said=None):
    loaded = load_recipe(RECIPES / "gptq-w4a16.yaml")
    data = loaded.recipe.model_dump(mode="python")
    data["signing"] = {"private_key": str(private_key)} if private_key else {}
    loaded = LoadedRecipe(recipe=type(loaded.recipe).model_validate(data), path=loaded.path)
    return RunContext(loaded, RunDir.create(loaded, tmp_path / "runs"),
                      progress=(said.append if said is not None else lambda *_: None))


def test_the_local_key_is_made_once_whole_and_its_owners_alone(tmp_path, cache):
    said: list[str] = []
    key, local = signing_key(ctx_for(tmp_path, said=said))
    assert local and key == local_key_path() and key.is_file() and local_public_key().is_file()
    assert key.parent == tmp_path / "config" / "quantlab" / "keys" and not cache.exists()  # the user's, not the cache
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in key.parent.iterdir()) == sorted([key.name, local_public_key().name])  # no temp
    assert public_key_fingerprint(public_pem_of(key)) == public_key_fingerprint(local_public_key().read_bytes())
    assert len(said) == 1 and "created a local development signing key" in said[0]
    before = key.read_bytes()
    assert signing_key(ctx_for(tmp_path, said=said)) == (key, True) and key.read_bytes() == before
    assert len(said) == 1  # reused, not made again


def test_runs_that_start_together_share_one_local_key(tmp_path, cache):
    got, barrier = [], threading.Barrier(4)

    def start(i):
        ctx = ctx_for(tmp_path / str(i))
        barrier.wait()
        key, _ = signing_key(ctx)
        got.append(public_key_fingerprint(public_pem_of(key)))
    threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(got) == 4 and len(set(got)) == 1
    assert public_key_fingerprint(local_public_key().read_bytes()) == got[0]  # the public half is the winner's


def test_a_key_planted_in_a_shared_cache_is_refused(tmp_path, cache):
    key = local_key_path()
    key.parent.mkdir(parents=True)
    generate_keypair(key, local_public_key())
    os.chmod(key, 0o644)  # as a file made with a shared umask, or by someone else
    with pytest.raises(RecipeError, match=r"mode 0644: others can read or write it.*chmod 600") as err:
        signing_key(ctx_for(tmp_path))
    assert err.value.exit_code == 2 and err.value.field == "signing.private_key"
    os.chmod(key, 0o600)
    other = os.getuid() + 4242
    if os.getuid() == 0:
        os.chown(key, other, -1)  # really another user's
        with pytest.raises(RecipeError, match=f"belongs to user id {other}, not to you"):
            signing_key(ctx_for(tmp_path))
        os.chown(key, 0, -1)
    key.unlink()
    key.symlink_to(tmp_path / "elsewhere.pem")
    with pytest.raises(RecipeError, match="is a symbolic link"):
        signing_key(ctx_for(tmp_path))


def test_a_key_of_another_user_is_refused(tmp_path, cache, monkeypatch):
    """As another user: the key's owner is read from the file, who runs from the process."""
    key, _ = signing_key(ctx_for(tmp_path))
    monkeypatch.setattr(os, "getuid", lambda: key.stat().st_uid + 1)
    with pytest.raises(RecipeError, match="belongs to user id .* a key someone else made"):
        signing_key(ctx_for(tmp_path / "again"))


def test_the_recipes_key_with_loose_permissions_is_refused(tmp_path, cache):
    priv = tmp_path / "keys" / "release.pem"
    generate_keypair(priv, priv.with_suffix(".pub.pem"))
    assert signing_key(ctx_for(tmp_path, priv)) == (priv, False)
    os.chmod(priv, 0o640)
    with pytest.raises(RecipeError, match="the signing key .* has mode 0640") as err:
        signing_key(ctx_for(tmp_path / "again", priv))
    assert err.value.field == "signing.private_key" and str(RECIPES / "gptq-w4a16.yaml") in str(err.value)
    with pytest.raises(RecipeError, match="does not exist; create one with `quantlab keygen"):
        signing_key(ctx_for(tmp_path / "third", tmp_path / "missing.pem"))


def test_a_local_key_that_cannot_be_created_is_a_clear_error(tmp_path, cache):
    """A keys folder that is not one this user can create in (here: a file in its place, as
    with one another user made) is exit 2 naming the folder and the fixes, not a traceback."""
    local_key_path().parent.parent.mkdir(parents=True)
    local_key_path().parent.write_text("not a folder")
    with pytest.raises(RecipeError, match="cannot create the local development key in .*keys: .*XDG_CONFIG_HOME.*"
                                          "signing.private_key") as err:
        signing_key(ctx_for(tmp_path))
    assert err.value.exit_code == 2 and err.value.field == "signing.private_key"
