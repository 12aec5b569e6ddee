"""Perf maps (/tmp/perf-PID.map): the symbols that JITs, and CPython 3.12+ under `-X perf`, write for generated code.

Each line is `START SIZE NAME`: hex with or without 0x, the name may hold spaces. The agent reads the file as the
process sees it (through /proc/PID/root, named by the pid in the process's own pid namespace) and publishes it as a
PERFMAP symbol table under a content-addressed id (`perfmap:<digest>`): an unchanged map keeps its id, a grown one
gets a new id. An anonymous executable mapping that holds its symbols points at that id with file_offset = start,
so the symbolizer's file offset (addr - start + file_offset) is the absolute address and the table has no segments.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import logging
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace

from producers.symbol_chunks import chunk_symbol_table
from schemas.wire import DEFAULT_MAX_BYTES as DEFAULT_CHUNK_BYTES
from schemas.wire import JIT_BINARY, u64_to_longs

log = logging.getLogger("fleetprof.perf_map")

BUILD_ID_PREFIX = "perfmap:"
# What frames of perf-map code show as their binary. The same in every process (perf shows `perf-PID.map`), so
# one Python function or JIT stub run by many processes is one frame fleet-wide.
DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_MAX_ENTRIES = 1_000_000
DEFAULT_MAX_SYMBOLS = 8_000_000

# START SIZE NAME; the name is everything after SIZE, less surrounding blanks.
_HEX = rb"(?:0[xX])?([0-9a-fA-F]{1,16})"
_LINE = re.compile(rb"[ \t]*" + _HEX + rb"[ \t]+" + _HEX + rb"[ \t]+(\S(?:.*\S)?)[ \t\r]*")


@dataclass(frozen=True)
class PerfMap:
    """One perf map's symbols, sorted by start address, one symbol per start."""

    build_id: str
    addrs: list[int]
    sizes: list[int]
    names: list[str]
    malformed: int = 0  # lines that are not START SIZE NAME, skipped
    truncated: bool = False  # the byte or entry cap cut the file short

    def __len__(self) -> int:
        return len(self.names)

    def covers(self, start: int, limit: int) -> bool:
        """Whether a symbol starts inside [start, limit)."""
        i = bisect.bisect_left(self.addrs, start)
        return i < len(self.addrs) and self.addrs[i] < limit


def is_perf_map_id(build_id: str) -> bool:
    return build_id.startswith(BUILD_ID_PREFIX)


def is_anonymous(path: str) -> bool:
    """Whether a /proc/PID/maps path is memory without a file of its own, where JITs put code."""
    return (path == "" or path.startswith(("[anon:", "/memfd:", "//anon", "/anon_hugepage"))
            or path == "[anon_shmem]")


def parse_perf_map(data: bytes, max_entries: int = DEFAULT_MAX_ENTRIES) -> PerfMap:
    """The symbols of perf map text. A later line for the same start wins: a JIT that reuses freed code memory
    writes the new function's line after the old one."""
    entries: dict[int, tuple[int, str]] = {}
    malformed = 0
    truncated = False
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            malformed += 1
            continue
        start = int(m[1], 16)
        if start not in entries and len(entries) >= max_entries:
            truncated = True
            break
        entries[start] = (int(m[2], 16), m[3].decode("utf-8", "replace"))
    addrs = sorted(entries)
    sizes = [entries[a][0] for a in addrs]
    names = [entries[a][1] for a in addrs]
    digest = hashlib.blake2b(digest_size=16)
    digest.update("".join(f"{a:x} {s:x} {n}\n" for a, s, n in zip(addrs, sizes, names, strict=True)).encode())
    return PerfMap(BUILD_ID_PREFIX + digest.hexdigest(), addrs, sizes, names, malformed, truncated)


def read_perf_map(path: str, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES) -> PerfMap:
    """Parse the perf map at `path`, at most max_bytes of it. A last line without its newline is being written and
    waits for the next read. OSError when it cannot be read or is not a regular file: a FIFO would block the agent,
    and a container's absolute symlink would resolve against the agent's root, naming one of the host's files."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        data = f.read(max_bytes + 1)
    truncated = len(data) > max_bytes
    data = data[:data.rfind(b"\n", 0, max_bytes) + 1]
    found = parse_perf_map(data, max_entries)
    if truncated and not found.truncated:
        found = replace(found, truncated=True)
    return found


def ns_pid(pid: int) -> int:
    """The pid that `pid` has in its own (innermost) pid namespace, which names its perf map; `pid` if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid


def perf_map_path(pid: int) -> str:
    """Where the agent reads `pid`'s perf map: its /tmp, through its root (a container's own /tmp)."""
    return f"/proc/{pid}/root/tmp/perf-{ns_pid(pid)}.map"


def perf_map_chunks(perf_map: PerfMap, max_bytes: int | None = DEFAULT_CHUNK_BYTES) -> list[dict]:
    """SymbolChunk records (kind PERFMAP, no load segments: lookup is by absolute address), each encoding to at most
    `max_bytes` (None: one chunk)."""
    return chunk_symbol_table(perf_map.build_id, JIT_BINARY, "PERFMAP", [], u64_to_longs(perf_map.addrs),
                              u64_to_longs(perf_map.sizes), perf_map.names, max_bytes)


@dataclass
class _PidMap:
    path: str
    key: tuple[int, ...] | None = None  # (device, inode, size, mtime) of the file last read
    perf_map: PerfMap | None = None


class PerfMapCache:
    """Each process's current perf map, re-read only when its file changed, plus lookup by id for the sender.

    Bounded: a process's map is dropped by forget() (the process cache forgets idle pids), each map holds at most
    max_entries symbols, and maps past max_symbols in all are not kept (counted in over_budget, with a warning).
    A file that cannot be read (the process exited, the map was removed) keeps the map read before.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_symbols: int = DEFAULT_MAX_SYMBOLS, path_of: Callable[[int], str] = perf_map_path) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.max_symbols = max_symbols
        self._path_of = path_of
        self.unreadable = 0  # files that exist but could not be read
        self.over_budget = 0  # maps not kept: max_symbols reached
        self._pids: dict[int, _PidMap] = {}
        self._by_id: dict[str, PerfMap] = {}  # the maps some process refers to now
        self._symbols = 0

    def get(self, pid: int) -> PerfMap | None:
        """`pid`'s perf map as it is now (re-read if the file changed), or the last one read, or None."""
        state = self._pids.get(pid)
        if state is None:
            state = self._pids[pid] = _PidMap(self._path_of(pid))
        try:
            st = os.stat(state.path, follow_symlinks=False)
        except OSError:
            return state.perf_map
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key == state.key:
            return state.perf_map
        state.key = key  # an unreadable file is tried again only once it changed
        try:
            found = read_perf_map(state.path, self.max_bytes, self.max_entries)
        except OSError as exc:
            self.unreadable += 1
            log.debug("perf map %s unreadable: %s", state.path, exc)
            return state.perf_map
        if found.malformed or found.truncated:
            log.debug("perf map %s: %d malformed lines skipped%s", state.path, found.malformed,
                      ", cut short (max_bytes/max_entries)" if found.truncated else "")
        self._replace(state, found)
        return state.perf_map

    def _replace(self, state: _PidMap, found: PerfMap) -> None:
        old, state.perf_map = state.perf_map, None
        if old is not None:
            self._release(old)
        if found.build_id not in self._by_id:
            if self._symbols + len(found) > self.max_symbols:
                self.over_budget += 1
                log.warning("perf map %s (%d symbols) not kept: %d held already; raise PerfMapCache.max_symbols "
                            "(%d)", state.path, len(found), self._symbols, self.max_symbols)
                return
            self._by_id[found.build_id] = found
            self._symbols += len(found)
        state.perf_map = self._by_id[found.build_id]

    def _release(self, old: PerfMap) -> None:
        """Drop a map no process refers to any more (its id was sent with the batches that referred to it)."""
        if old.build_id in self._by_id and not any(s.perf_map is old for s in self._pids.values()):
            del self._by_id[old.build_id]
            self._symbols -= len(old)

    def chunks(self, build_id: str, max_bytes: int | None = DEFAULT_CHUNK_BYTES) -> list[dict] | None:
        """SymbolChunk records of a map held now, by its id; None when none is held under that id."""
        found = self._by_id.get(build_id)
        return perf_map_chunks(found, max_bytes) if found is not None else None

    def ids(self) -> set[str]:
        """The ids of the maps held now."""
        return set(self._by_id)

    def forget(self, pid: int) -> None:
        state = self._pids.pop(pid, None)
        if state is not None and state.perf_map is not None:
            self._release(state.perf_map)

    def __len__(self) -> int:
        return len(self._pids)


# One per agent process, shared by the process cache (which reads maps) and the sender (which publishes them), so
# they meet without being wired to each other.
DEFAULT_PERF_MAPS = PerfMapCache()
