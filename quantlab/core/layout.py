"""Names of the files and folders quantlab writes, in one place, and where its cache is."""

import os
from pathlib import Path

CHECKPOINT_DIR = "checkpoint"  # in a run folder
SERVE_LOG_DIR = "serve"  # in a run folder: <role>-server.log
ERROR_DIR = "errors"  # in a run folder: tracebacks of unexpected errors
LOG_DIR = "logs"  # in a run folder: what the engines print (llmcompressor.log)
QUANTIZE_RESULT_FILE = "quantize.json"  # in a checkpoint
RECIPE_COPY_FILE = "quantlab-recipe.yaml"  # in a checkpoint

# a run folder's stage folders and files
QUALITY_DIR = "quality"  # samples per role, flips, KL, plots
PERF_DIR = "perf"  # per-request rows, plots
STABILITY_DIR = "stability"
LOAD_QUALITY_DIR = "load-quality"  # per role and load: samples, timed requests
RECORD_FILE = "run.json"  # the run record, rewritten after every stage
MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
JUNIT_FILE = "junit.xml"
KL_FILE = "kl-topk.json"  # in quality/<role>/: next-token distributions
# in a released folder
MANIFEST_FILE = "quantlab-manifest.json"
SIGNATURE_FILE = "quantlab-manifest.sig"
REGISTRATION_FILE = "quantlab-registration.json"  # the gate set registered before any engine (release/registration)
REGISTRATION_SIG = "quantlab-registration.sig"  # its signature, as copied into a released folder
# the release's in-toto attestation (release/attestation): a DSSE envelope (key or certificate signing), or a
# Sigstore bundle holding one; written after the folder's signature, outside what it signs
ATTESTATION_FILE = "quantlab-attestation.intoto.jsonl"
ATTESTATION_BUNDLE = "quantlab-attestation.sigstore.json"
SBOM_DIR = "sbom"  # in a released folder: <environment>-env.cdx.json, a CycloneDX SBOM of each (release/environments)
# what the release stage adds to a checkpoint folder: never part of a checkpoint's recorded files
RELEASE_FILES = (MANIFEST_FILE, SIGNATURE_FILE, REGISTRATION_FILE, REGISTRATION_SIG, ATTESTATION_FILE,
                 ATTESTATION_BUNDLE)


def release_owned(rel: str) -> bool:
    """Whether a path in a checkpoint folder (relative, POSIX) is one a release writes there."""
    return rel in RELEASE_FILES or rel.split("/")[0] == SBOM_DIR
PROVENANCE_FILE = "quantlab-provenance.json"  # in a converted model folder
# under the runs root, beside <recipe>/<run id>/
COMPARE_DIR = "compare"  # compare/<id>/: several candidates
CANDIDATES_DIR = "candidates"  # compare/<id>/candidates/<name>/<run id>/
COMPARISON_FILE = "comparison.json"  # in compare/<id>/
SEARCH_DIR = "search"  # search/<recipe>/<id>/
SENSITIVITY_DIR = "sensitivity"  # sensitivity/<recipe>/<id>/


def config_dir() -> Path:
    """quantlab's per-user settings folder ($XDG_CONFIG_HOME/quantlab, else ~/.config/quantlab): what
    must stay this user's own even when the cache folder is shared (the cache's secret)."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base).expanduser() / "quantlab"


def cache_dir() -> Path:
    """Where quantlab keeps built models, the probe and cached results. QUANTLAB_CACHE_DIR overrides it."""
    env = os.environ.get("QUANTLAB_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quantlab"
    return base.expanduser()
