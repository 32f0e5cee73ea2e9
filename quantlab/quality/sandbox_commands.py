"""The command lines that start a program in the code sandbox: what it sees and how.

The view is built from a whitelist, never by hiding things from the host's: the system's
/usr and its /lib*, /bin links, the few /etc files the dynamic loader and time need, the
Python's own prefix and base prefix, and any folder the caller names (a user scorer's),
all read-only and nosuid; a private tmpfs as /tmp (the working folder), a fresh /proc of
the sandbox's own PID namespace, a minimal /dev. Everything else (the home directory, the
run folder, the caches, key files) simply does not exist inside.

- bwrap (bubblewrap) builds that root itself (`--ro-bind`, `--tmpfs`, `--proc`, `--dev`),
  in new net, PID, IPC and UTS namespaces, a new session, killed when its parent dies.
- unshare (util-linux) gives the same namespaces; a short `sh` script then builds the same
  root on a tmpfs with `mount --bind` and enters it with `chroot`. It needs real root: for
  another user, `--map-root-user` would leave the program root in its user namespace, with
  every capability, and root in a chroot can leave it (chroot into a subfolder, `..` up,
  chroot "."), so sandbox.probe refuses unshare unless quantlab runs as root.

Run as root, the program itself must not be root: the kernel never holds root to
RLIMIT_NPROC, and root in a chroot can leave it. So the sandbox keeps only CAP_SETUID and
CAP_SETGID (bwrap) and the wrapper (sandbox.WRAPPER) drops to `nobody` before it runs any
of the program. As another user, bwrap maps that user into a new user namespace and drops
every capability before the program starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

NOBODY = 65534  # the uid and gid a program runs as when quantlab runs as root
TMPFS_BYTES = 64 << 20  # the sandbox's /tmp (its working folder): RAM, so bounded
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime")
DEVICES = ("null", "zero", "full", "random", "urandom")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}  # all a program gets


class ViewError(ValueError):
    """A folder the sandbox would show holds what it must hide (the home directory, the root)."""


def python_dirs() -> list[str]:
    """The folders the running Python needs: its prefix (a virtual environment) and base prefix."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            str(Path(sys.executable).resolve().parent.parent)}
    home = Path.home().resolve()
    for d in dirs:
        p = Path(d).resolve()
        if p == Path("/") or home == p or p in home.parents:
            raise ViewError(f"the Python's prefix {p} would show the home directory {home} to model code; "
                            "run quantlab from a virtual environment or a Python installed in its own folder")
    return sorted(dirs)


def _view(readable: tuple[str, ...]) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(links, folders, files) of the sandbox's root: symbolic links as (path, target),
    read-only folders (none inside another), read-only files."""
    links, folders = [], []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d):
            folders.append(d)
    for d in python_dirs() + [str(Path(r).resolve()) for r in readable]:
        if os.path.isdir(d) and not any(d == f or d.startswith(f.rstrip("/") + "/") for f in folders):
            folders = [f for f in folders if not f.startswith(d.rstrip("/") + "/")] + [d]
    files = [f for f in ETC_FILES if os.path.isfile(f) and not os.path.islink(f)]
    links += [(f, os.readlink(f)) for f in ETC_FILES if os.path.islink(f)]
    return links, folders, files


def bwrap_argv(tool: str, readable: tuple[str, ...], as_root: bool) -> list[str]:
    links, folders, files = _view(readable)
    argv = [tool, "--die-with-parent", "--new-session", "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    # another user: a user namespace is how bwrap gets to mount at all; root keeps what it drops to nobody with
    argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if as_root else ["--unshare-user"]
    # /tmp first: a folder shown from under the host's /tmp (a scorer's) is bound inside it after
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp"]
    for path, target in links:
        argv += ["--symlink", target, path]
    # the folders above a bound one, searchable by the program (bwrap copies the host's modes: /root is 0700)
    above = {str(p) for f in folders + files for p in Path(f).parents if str(p) not in ("/", "/tmp")}
    for path in sorted(above - set(folders), key=lambda p: p.count("/")):
        argv += ["--perms", "0755", "--dir", path]
    for path in folders + files:
        argv += ["--ro-bind", path, path]
    argv += ["--chdir", "/tmp", "--clearenv"]
    for k, v in ENV.items():
        argv += ["--setenv", k, v]
    return argv + ["--"]


# $1: the empty folder that becomes the root; then ro:PATH, file:PATH and link:PATH=TARGET
# entries, "--", and the command to run inside. Mounts stay in the new mount namespace.
UNSHARE_SCRIPT = r"""set -eu
root=$1; shift
mount -t tmpfs -o size=%(tmpfs)d,mode=0755 sandbox "$root"
mkdir -p "$root/proc" "$root/tmp" "$root/dev"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc" || :
mount -t tmpfs -o size=%(tmpfs)d,mode=1777,nosuid,nodev sandbox "$root/tmp"
for d in %(devices)s; do : > "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"; done
ro() { mount --bind "$1" "$2"; mount -o remount,bind,ro,nosuid,nodev "$2"; }
while [ "$1" != "--" ]; do
  entry=$1; shift
  case $entry in
    ro:*) p=${entry#ro:}; mkdir -p "$root$p"; ro "$p" "$root$p" ;;
    file:*) p=${entry#file:}; mkdir -p "$(dirname "$root$p")"; : > "$root$p"; ro "$p" "$root$p" ;;
    link:*) p=${entry#link:}; mkdir -p "$(dirname "$root${p%%%%=*}")"; ln -s "${p#*=}" "$root${p%%%%=*}" ;;
  esac
done
shift
mount -o remount,ro,bind "$root"
exec /usr/bin/env -i %(env)s /usr/sbin/chroot "$root" "$@"
""" % {"tmpfs": TMPFS_BYTES, "devices": " ".join(DEVICES), "env": " ".join(f"{k}={v}" for k, v in ENV.items())}


def unshare_argv(tool: str, readable: tuple[str, ...], root_dir: Path) -> list[str]:
    """Run as root only (see the module's docstring): no user namespace, so nothing maps a user to root."""
    links, folders, files = _view(readable)
    entries = [f"ro:{p}" for p in folders] + [f"file:{p}" for p in files] + [f"link:{p}={t}" for p, t in links]
    argv = [tool, "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    return argv + ["--", "/bin/sh", "-c", UNSHARE_SCRIPT, "sh", str(root_dir), *entries, "--"]
