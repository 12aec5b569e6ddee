"""Serving a Starlette app (the query API, the web UI) with uvicorn in a background thread of this process."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette

STARTUP_TIMEOUT_S = 10.0


class AppServer:
    """A running app: uvicorn in a background thread on a socket bound before the thread starts."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, sock: socket.socket):
        self._server = server
        self._thread = thread
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]

    @property
    def address(self) -> str:
        """host:port, as Settings.api spells it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, finish requests in flight, and join the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()


def serve_app(app: Starlette, host: str, port: int, what: str) -> AppServer:
    """Serve `app` on host:port in a background thread until .stop(); raises OSError if the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        # Bound here, not in uvicorn, so a taken port is an OSError for the caller instead of a sys.exit in a thread.
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    # uvicorn installs signal handlers only on the main thread, so this thread leaves the caller's handlers alone.
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="fleetprof-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise OSError(f"{what} did not start on {host}:{port}")
        time.sleep(0.01)
    return AppServer(server, thread, sock)
