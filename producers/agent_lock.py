"""One agent per node and data directory: two would sample everything twice and store it twice without a word.

The lock is an flock on `<data dir>/agent/<node>.pid`, so it goes with its process however that ends (SIGKILL too);
the file names the holder's pid for the one-line refusal. A second agent on the same machine for another node (a
test fleet, or `--node` naming a VM's guest) takes its own lock.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path


class AgentRunning(RuntimeError):
    """Another agent holds the lock; the message is one line naming it."""


class AgentLock:
    """Held from `acquire()` until `release()` or the process ends."""

    def __init__(self, data_dir: Path, node: str) -> None:
        self.data_dir = Path(data_dir)
        self.node = node
        self.path = self.data_dir / "agent" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', node)}.pid"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AgentRunning(f"another fleetprof agent (pid {holder}) already runs for node {self.node!r} with "
                               f"data directory {self.data_dir}: stop it first, or give this one --node NAME if it "
                               "profiles a different node") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays, naming no live holder
            self._fd = None

    def __enter__(self) -> AgentLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
