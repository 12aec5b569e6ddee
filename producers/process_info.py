"""What the agent records about a sampled process: comm, exe, cgroup / container id, and executable mappings.

Everything comes from /proc; a process that is gone (or goes mid-read) gives None, never an exception.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from producers.elf_symbols import ElfError, read_build_id
from producers.perf_map import DEFAULT_PERF_MAPS, PerfMap, PerfMapCache, is_anonymous
from schemas.wire import JIT_BINARY, u64_to_long

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


def read_process_info(pid: int, proc_root: str = "/proc") -> ProcessInfo | None:
    """A pid's comm, cgroup and container id, without its mappings (NVML's rows need none); None when it is gone."""
    try:
        with open(f"{proc_root}/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return None
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            cgroup = parse_cgroup(f.read())
    except OSError:
        cgroup = ""
    return ProcessInfo(pid, comm, "", cgroup, container_id(cgroup))


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


def process_start_ns(pid: int) -> int:
    """Boot-relative start time of `pid` in ns (/proc/PID/stat starttime), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0


class ProcessCache:
    """Process metadata captured when a pid is first seen, so a process that exits later still symbolizes.

    A pid not sampled for `idle_windows` windows is forgotten (it has likely exited, and its number may be reused),
    which also bounds the cache by the processes active recently. Mappings of a live process are read again when
    its samples land outside all of them (code it mapped later: a JIT), at most once per window.
    """

    def __init__(self, lookup: Callable[[int], ProcessInfo | None] = process_info, idle_windows: int = 6,
                 perf_maps: PerfMapCache | None = None, max_unmapped: int = 4096) -> None:
        self._lookup = lookup
        self._infos: dict[int, ProcessInfo] = {}
        self._last_window: dict[int, int] = {}
        self._reread_window: dict[int, int] = {}
        # Addresses still outside every mapping after a re-read (a broken frame-pointer chain gives junk): they do
        # not cause another re-read. At most max_unmapped per process.
        self._unmapped: dict[int, set[int]] = {}
        self.max_unmapped = max_unmapped
        self.perf_maps = perf_maps if perf_maps is not None else DEFAULT_PERF_MAPS
        self.idle_windows = idle_windows
        self.window = 0
        self._ended: int | None = None
        self.rereads = 0
        self.reads = 0  # processes read from /proc

    def get(self, pid: int) -> ProcessInfo:
        """The cached info, else read now; a pid already gone gets a placeholder without mappings."""
        info = self._infos.get(pid)
        if info is None:
            info = self._read(pid) or ProcessInfo(pid, comm="", exe="", cgroup="", container_id="")
        self._last_window[pid] = self.window
        return info

    def has(self, pid: int) -> bool:
        return pid in self._infos

    def refresh(self, pid: int) -> ProcessInfo | None:
        """Read `pid` now (a new process, or one that ran exec), keeping what was read before if it is gone."""
        info = self._read(pid)
        if info is not None:
            self._last_window[pid] = self.window
            self._unmapped.pop(pid, None)
        return info or self._infos.get(pid)

    def _read(self, pid: int) -> ProcessInfo | None:
        info = self._lookup(pid)
        if info is not None:
            self._infos[pid] = info
            self.reads += 1
            if any(is_anonymous(m.path) for m in info.mappings):
                self.perf_maps.get(pid)  # now, in case the process exits before its window ends
        return info

    def covering(self, pid: int, addrs: list[int]) -> ProcessInfo:
        """The info of `pid`, its mappings read again first when some of `addrs` lie outside all of them and were
        not outside after an earlier re-read; a process that is gone keeps what was read before."""
        info = self.get(pid)
        outside = _outside(info.mappings, addrs) - self._unmapped.get(pid, set())
        if not outside or self._reread_window.get(pid) == self.window:
            return info
        self._reread_window[pid] = self.window
        self.rereads += 1
        fresh = self._lookup(pid)
        if fresh is not None:
            self._infos[pid] = info = fresh
        known = self._unmapped.setdefault(pid, set())
        if len(known) > self.max_unmapped:
            known.clear()
        known |= _outside(info.mappings, list(outside))
        return info

    def end_window(self, index: int | None = None) -> None:
        """Close a window (once per `index`, however many collectors close it): forget pids idle for too long."""
        if index is not None:
            if index == self._ended:
                return
            self._ended = index
        self.window += 1
        for pid in [p for p, w in self._last_window.items() if self.window - w > self.idle_windows]:
            del self._last_window[pid]
            self._infos.pop(pid, None)
            self._reread_window.pop(pid, None)
            self._unmapped.pop(pid, None)
            self.perf_maps.forget(pid)

    def __len__(self) -> int:
        return len(self._infos)


def _outside(mappings: list[Mapping], addrs: list[int]) -> set[int]:
    """The addresses in none of the mappings."""
    if not addrs:
        return set()
    if not mappings:
        return set(addrs)
    spans = sorted((m.start, m.limit) for m in mappings)
    starts = np.array([s for s, _ in spans], dtype=np.uint64)
    limits = np.array([lim for _, lim in spans], dtype=np.uint64)
    values = np.array(addrs, dtype=np.uint64)
    i = np.searchsorted(starts, values, side="right").astype(np.int64) - 1
    inside = (i >= 0) & (values < limits[np.maximum(i, 0)])
    return set(values[~inside].tolist())


def batch_mappings(info: ProcessInfo, perf_map: PerfMap | None) -> list[dict]:
    """The Mapping records of a process. An anonymous mapping that holds perf-map symbols points at the perf map's
    table with file_offset = start, so the symbolizer's file offset is the absolute address the map names."""
    out = []
    for m in info.mappings:
        rec = {**asdict(m), "start": u64_to_long(m.start), "limit": u64_to_long(m.limit)}
        if perf_map is not None and is_anonymous(m.path) and perf_map.covers(m.start, m.limit):
            rec.update(path=JIT_BINARY, build_id=perf_map.build_id, file_offset=u64_to_long(m.start))
        out.append(rec)
    return out


@dataclass(frozen=True)
class ProcessFilter:
    """Which processes a window keeps: by command name and by cgroup path prefix (None: all)."""

    comm: str | None = None
    cgroup: str | None = None

    def accepts(self, info: ProcessInfo) -> bool:
        if self.comm is not None and info.comm != self.comm:
            return False
        return self.cgroup is None or info.cgroup.startswith(self.cgroup)


KEEP_ALL = ProcessFilter()
