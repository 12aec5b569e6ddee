"""Free TCP ports on 127.0.0.1 for the benches' own brokers and servers."""

from __future__ import annotations

import socket
from contextlib import ExitStack


def free_ports(n: int) -> list[int]:
    """`n` distinct ports that nobody listens on right now (bound together, so they differ)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
