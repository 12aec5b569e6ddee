"""`host:port` addresses of the query API and the web UI: parsing them, and whether a host is this machine only."""

from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) to (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return host.strip("[]") or DEFAULT_HOST, int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
