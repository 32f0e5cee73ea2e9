"""Who listens on a port: the listening TCP sockets in /proc/net/tcp and tcp6 and the
processes of one process group that hold them (their /proc/<pid>/fd links).

quantlab picks a free port, closes it and lets vLLM bind it: between the two, another
process may take the port, and then /health answers from a server that is not ours. After
/health answers, `owned_by_group` says whether every listener a client of host:port could
reach belongs to the engine's own process group (start_new_session: its pid is the group)."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

LISTEN = "0A"  # TCP state in /proc/net/tcp


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    # the kernel prints each 32-bit word in host order (little-endian on x86 and arm64)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listeners(port: int, proc: Path = Path("/proc")) -> dict[int, str] | None:
    """{socket inode: local address} of the sockets listening on `port` (None: no /proc/net here)."""
    found: dict[int, str] = {}
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            address, _, hex_port = fields[1].rpartition(":")
            if int(hex_port, 16) == port:
                found[int(fields[9])] = str(_address(address))
    return found if readable else None


def group_sockets(pgid: int, proc: Path = Path("/proc")) -> set[int]:
    """Socket inodes held open by the processes of process group `pgid` (those this user may read)."""
    inodes: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:  # fields after the command: state, ppid, pgrp
                continue
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return inodes


def host_addresses(host: str) -> set[str]:
    try:
        return {str(ipaddress.ip_address(host.strip("[]")))}
    except ValueError:
        pass
    try:
        return {str(ipaddress.ip_address(i[4][0].split("%", 1)[0])) for i in socket.getaddrinfo(host, None)}
    except OSError:
        return set()


def reachable(address: str, host: str, addresses: set[str]) -> bool:
    """Whether a client of host:port may reach a socket listening on `address`."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_unspecified or address in addresses or (mapped is not None and str(mapped) in addresses) \
        or host in ("0.0.0.0", "::", "")


def owned_by_group(host: str, port: int, pgid: int, proc: Path = Path("/proc")) -> tuple[bool | None, str]:
    """(True: every listener a client of host:port reaches is in the group; False: one is not
    or none is; None: this host has no /proc/net to tell) and what was seen, in words."""
    found = listeners(port, proc)
    if found is None:
        return None, "no /proc/net/tcp here"
    addresses = host_addresses(host)
    relevant = {inode: a for inode, a in found.items() if reachable(a, host, addresses)}
    if not relevant:
        return False, f"nothing listens on {host}:{port}"
    ours = group_sockets(pgid, proc)
    foreign = sorted(a for inode, a in relevant.items() if inode not in ours)
    if foreign:
        return False, f"a process outside the server's group listens on {', '.join(foreign)} port {port}"
    return True, f"port {port} is held by the server's own process group {pgid}"
