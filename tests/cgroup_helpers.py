"""Real cgroups for the identity tests: nested cgroup v2 directories shaped like containerd's, CRI-O's and
slurmstepd's, under one test-owned root, with processes started inside them (root only)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.elf_helpers import unavailable


def cgroup2_mount() -> Path | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup on a pure v2 host, /sys/fs/cgroup/unified on a
    hybrid one; None without one."""
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    return None


class CgroupTree:
    """Cgroups under /<root>/ of the v2 hierarchy; close() kills what runs in them and removes them, deepest first."""

    def __init__(self, mount: Path, root: str) -> None:
        self.mount = mount
        self.root = "/" + root.strip("/")
        self.made: list[Path] = []
        self.procs: list[subprocess.Popen] = []

    def path(self, relative: str) -> str:
        """The cgroup path a process inside `relative` reads in /proc/PID/cgroup."""
        return f"{self.root}/{relative.strip('/')}"

    def make(self, relative: str) -> Path:
        directory = self.mount / self.path(relative).lstrip("/")
        for parent in reversed([directory, *directory.parents]):
            if parent in (self.mount, *self.mount.parents) or parent.exists():
                continue
            parent.mkdir()
            self.made.append(parent)
        return directory

    def run(self, relative: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """`argv` started inside the cgroup: a shell moves itself there, then execs it (so its first instruction
        already runs in the cgroup)."""
        procs = self.make(relative) / "cgroup.procs"
        proc = subprocess.Popen(["/bin/sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *argv], env=env,
                                stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            if proc.stdout:
                proc.stdout.close()
        for directory in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):  # a killed process leaves its cgroup a moment after wait() returns
                with contextlib.suppress(FileNotFoundError):
                    try:
                        directory.rmdir()
                    except OSError:
                        time.sleep(0.05)
                        continue
                break


@contextlib.contextmanager
def cgroup_tree(root: str) -> Iterator[CgroupTree]:
    mount = cgroup2_mount()
    if mount is None or os.geteuid() != 0:
        unavailable("needs root and a cgroup v2 hierarchy to make cgroups in")
    tree = CgroupTree(mount, root)
    try:
        yield tree
    finally:
        tree.close()
