"""Whether the servers quantlab starts can be reached from other hosts: serve.host other
than a loopback address (0.0.0.0, a LAN address, a name that resolves to one) opens them
to the network, so it needs serve.expose: true, and the dry run and the report say so."""

from __future__ import annotations

import ipaddress
import socket

from quantlab.core.errors import RecipeError
from quantlab.recipe.serve import ServeSpec


def loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False  # cannot tell: treated as reachable from elsewhere
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addresses)


def exposure(spec: ServeSpec) -> str | None:
    """In words, how the servers are exposed (None: only this host can reach them, or
    quantlab starts none). RecipeError when exposed without serve.expose: true."""
    if spec.mode == "endpoint" or loopback(spec.host):
        return None
    where = "every interface of this host" if spec.host in ("0.0.0.0", "::", "") else spec.host
    if not spec.expose:
        raise RecipeError(f"serve.host is {spec.host!r}, not a loopback address: the servers would listen on {where}, "
                          "reachable from other hosts. Use 127.0.0.1, or set serve.expose: true to serve there on "
                          "purpose", field="serve.host / serve.expose")
    return (f"the servers listen on {where} (serve.host {spec.host}, serve.expose: true): other hosts can reach "
            "them; every path but /health (the API and /metrics too) answers only requests with the run's random key, "
            "/health answers anyone")
