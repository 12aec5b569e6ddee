"""What the agent records about a sampled process: comm, exe, cgroup / container id, and executable mappings.

Everything comes from /proc; a process that is gone (or goes mid-read) gives None, never an exception.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from producers.elf_symbols import ElfError, read_build_id

_CONTAINER_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


@dataclass
class Mapping:
    start: int
    limit: int
    file_offset: int
    path: str
    build_id: str  # "" for anonymous, special ([vdso]) or unreadable files


@dataclass
class ProcessInfo:
    pid: int
    comm: str
    exe: str
    cgroup: str
    container_id: str
    mappings: list[Mapping] = field(default_factory=list)


class BuildIdCache:
    """Build ids by (device, inode, mtime): each file is read once however many processes map it."""

    def __init__(self, max_entries: int = 20_000) -> None:
        self._ids: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        self.max_entries = max_entries

    def get(self, path: str) -> str:
        """The build id of the file at `path` (as this process sees it), or "" when it cannot be read."""
        try:
            st = os.stat(path)
        except OSError:
            return ""
        key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        found = self._ids.get(key)
        if found is not None:
            self._ids.move_to_end(key)
            return found
        try:
            build_id = read_build_id(path)
        except (ElfError, OSError):
            build_id = ""
        self._ids[key] = build_id
        if len(self._ids) > self.max_entries:
            self._ids.popitem(last=False)
        return build_id


_DEFAULT_CACHE = BuildIdCache()


def container_id(cgroup_path: str) -> str:
    """The last 64-hex id in a cgroup path (docker, containerd, cri-o all embed one), else ""."""
    found = _CONTAINER_ID.findall(cgroup_path)
    return found[-1] if found else ""


def parse_cgroup(text: str) -> str:
    """The process's cgroup path: the unified (v2) entry, else the first v1 hierarchy's."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.setdefault(parts[1], parts[2])
    if "" in paths:
        return paths[""]
    return next(iter(paths.values()), "")


def parse_maps(text: str) -> list[tuple[int, int, int, str]]:
    """(start, limit, file offset, path) of each executable mapping in /proc/PID/maps text; path "" if anonymous."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        lo, _, hi = parts[0].partition("-")
        out.append((int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].strip() if len(parts) == 6 else ""))
    return out


DELETED = " (deleted)"


def mapped_file(pid: int, start: int, limit: int, path: str) -> str:
    """Where the agent reads a mapped file: through the process's root, so a binary inside a container resolves to
    the container's file; a deleted one through /proc/PID/map_files, which still opens the unlinked inode (root)."""
    if path.endswith(DELETED):
        return f"/proc/{pid}/map_files/{start:x}-{limit:x}"
    return f"/proc/{pid}/root{path}"


def _build_id_for(pid: int, start: int, limit: int, path: str, cache: BuildIdCache) -> str:
    if not path.startswith("/"):
        return ""
    return cache.get(mapped_file(pid, start, limit, path))


def read_mappings(pid: int, cache: BuildIdCache | None = None) -> list[Mapping] | None:
    """Executable mappings of `pid` with build ids; None when the process is gone, [] when not permitted."""
    cache = cache or _DEFAULT_CACHE
    try:
        with open(f"/proc/{pid}/maps") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return []
    return [Mapping(lo, hi, off, path, _build_id_for(pid, lo, hi, path, cache))
            for lo, hi, off, path in parse_maps(text)]


def process_info(pid: int, cache: BuildIdCache | None = None) -> ProcessInfo | None:
    """What /proc says about `pid`, or None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().rstrip("\n")
    except OSError:
        return None
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:  # kernel threads have none; another user's process without root
        exe = ""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            cgroup = parse_cgroup(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        cgroup = ""
    mappings = read_mappings(pid, cache)
    if mappings is None:
        return None
    return ProcessInfo(pid, comm, exe, cgroup, container_id(cgroup), mappings)
