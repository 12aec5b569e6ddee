"""Which loaded ELF objects carry fleetprof USDT probes: every executable file mapping of every process, each file
read once per (device, inode, mtime), opened through /proc/PID when the agent's own view of the path differs."""

from __future__ import annotations

import logging
import os
import platform
import re
from collections import OrderedDict
from dataclasses import dataclass, replace

from producers.process_info import DELETED, mapped_file
from producers.usdt_notes import NoteError, ProbeSite, read_probe_sites

log = logging.getLogger("fleetprof.gpu_probes")

SIMULATOR_PREFIX = "libfleetprof_gpusim"  # records from the GPU simulator's library are labelled simulated


@dataclass
class ProbeObject:
    """An ELF file with fleetprof probes, as one process mapped it."""

    key: tuple[int, int, int]  # (device, inode, mtime ns): the file's identity
    path: str  # as the mapping names it
    open_path: str  # where the agent opens it: the path itself if it names the same file here, else via /proc/PID
    sites: list[ProbeSite]
    unsupported: int = 0  # fleetprof probe sites whose arguments this reader cannot decode
    simulated: bool = False


_EXEC_MAPPING = re.compile(rb"^([0-9a-f]+)-([0-9a-f]+) ..x. [0-9a-f]+ ([0-9a-f]+:[0-9a-f]+) ([1-9]\d*) +(/.*)$",
                           re.MULTILINE)


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


class ProbeFinder:
    """Which files mapped executable by running processes carry fleetprof probes. Each file, by (device, inode,
    mtime), is parsed once; the cache holds at most `max_files` (least recently seen go first). `proc` is the
    /proc to scan: a folder of links to some of its entries limits a scan to those processes."""

    def __init__(self, proc: str = "/proc", max_files: int = 20_000, arch: str | None = None) -> None:
        self.proc = proc
        self.max_files = max_files
        self.arch = arch or platform.machine()
        self._files: OrderedDict[tuple[int, int, int], ProbeObject | None] = OrderedDict()
        self.parsed = 0  # files whose notes were read
        self.unreadable = 0  # files that are not well-formed ELF
        self.unsupported = 0  # fleetprof probe sites whose arguments cannot be decoded
        self.pids = 0  # processes read by the last scan

    def process_names(self) -> list[str]:
        """The pids under the proc folder now, as names."""
        return [name for name in os.listdir(self.proc) if name.isdigit()]

    def scan(self, pids: list[str] | None = None) -> dict[tuple[int, int, int], ProbeObject]:
        """The objects with fleetprof probes mapped now by the processes `pids` (default: all), by file identity."""
        # per mapped file, a few processes that map it: the first may exit before its file is opened
        where: dict[tuple[bytes, bytes], list[tuple[int, int, int, str]]] = {}
        self.pids = 0
        for name in self.process_names() if pids is None else pids:
            try:
                with open(f"{self.proc}/{name}/maps", "rb") as f:
                    text = f.read()
            except OSError:  # gone, or a kernel thread's empty maps
                continue
            self.pids += 1
            for lo, hi, dev, inode, path in _EXEC_MAPPING.findall(text):
                mappers = where.setdefault((dev, inode), [])
                if len(mappers) < 4:
                    mappers.append((int(name), int(lo, 16), int(hi, 16), os.fsdecode(path.rstrip())))
        found = {}
        for mappers in where.values():
            for pid, lo, hi, path in mappers:
                open_path = mapped_file(pid, lo, hi, path)
                if self.proc != "/proc":
                    open_path = open_path.replace("/proc/", f"{self.proc}/", 1)
                try:
                    st = os.stat(open_path)
                except OSError:  # that process is gone (or its root is not ours to see): try another
                    continue
                key = (st.st_dev, st.st_ino, st.st_mtime_ns)
                if _identity(path) == key:  # the same file here: attach by a path that outlives the process
                    open_path = path
                obj = self._object(key, open_path, path)
                if obj is not None:
                    found[obj.key] = obj
                break
        return found

    def _object(self, key: tuple[int, int, int], open_path: str, path: str) -> ProbeObject | None:
        if key in self._files:
            self._files.move_to_end(key)
            known = self._files[key]
            # opened through this process: the one that mapped it first may be gone
            return replace(known, path=path.removesuffix(DELETED), open_path=open_path) if known else None
        obj = None
        try:
            sites, unsupported = read_probe_sites(open_path, self.arch)
            self.parsed += 1
            self.unsupported += unsupported
        except OSError:  # the process went away mid-read: not remembered, the next scan tries again
            return None
        except NoteError as exc:
            log.debug("%s", exc)
            self.unreadable += 1
            sites, unsupported = [], 0
        if sites or unsupported:
            shown = path.removesuffix(DELETED)
            obj = ProbeObject(key, shown, open_path, sites, unsupported,
                              os.path.basename(shown).startswith(SIMULATOR_PREFIX))
        self._files[key] = obj
        if len(self._files) > self.max_files:
            self._files.popitem(last=False)
        return obj
