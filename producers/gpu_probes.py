"""GPU launches, kernels, copies and sets from the fleetprof USDT probes (native/include/fleetprof_probes.h), as
GpuLaunch and GpuKernel records (schemas/gpu_launch.v3.avsc, gpu_kernel.v2.avsc).

The kernel side is producers/bpf/gpu_probes.bpf.c (bcc C, compiled once at start()). Which objects carry the probes
is producers/probe_finder.py's concern, where each probe keeps its arguments producers/usdt_notes.py's; here:
attaching and reading the ring buffers; turning their records into schema records is producers/gpu_records.py's.

Attaching is per ELF object by path: a uprobe is bound to the file's inode, so every process that maps the object,
now or later, in any mount namespace, is covered without a rescan. The probes' semaphores are counted by the
kernel (uprobe ref_ctr_offset, Linux 4.20+): it raises them in every process mapping the file, again at each new
mapping, and lowers them when the uprobe goes. bcc 0.26 cannot do this itself: USDT(path=...) refuses probes that
have semaphores (it would poke them through /proc/PID/mem, so it needs a pid), and its Python attach_uprobe() does
not pass libbcc's ref_ctr_offset argument, so this module calls libbcc's bpf_attach_uprobe with it.

Time: the BPF side stamps launches with bpf_ktime_get_ns() (CLOCK_MONOTONIC); poll() adds the Unix-minus-monotonic
offset measured when it reads the ring, so a clock step (NTP) is followed within one poll. bpf_ktime_get_tai_ns
would need the kernel's TAI offset, which is 0 unless a time daemon sets it.
"""

from __future__ import annotations

import ctypes as ct
import logging
import os
import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from producers.agent import Records, Window
from producers.cpu_sampler import BpfUnavailable, check_bpf
from producers.gpu_records import RecordMaker
from producers.identity_refs import Identities, process_identity
from producers.memory import release_after_compile
from producers.perf_map import is_anonymous
from producers.probe_finder import ProbeFinder, ProbeObject
from producers.process_info import KEEP_ALL, ProcessCache, ProcessFilter, batch_mappings
from producers.unwind_program import FRAME_POINTERS, load_unwinding_program
from producers.usdt_notes import MAX_REG, PROBES, PROVIDER

if TYPE_CHECKING:
    from producers.python_frames import PythonStacks
    from producers.unwind_maps import UnwindLoader

log = logging.getLogger("fleetprof.gpu_probes")

BPF_SOURCE = Path(__file__).resolve().parent / "bpf" / "gpu_probes.bpf.c"
MAX_SITES_LIMIT = 64  # wrappers written out in BPF_SOURCE
# BPF_SOURCE's unwind_progs, in order: the walk's two continuations, then the handlers each slot's wrapper tail-calls
TAIL_CALLED = (b"gpu_unwind", b"gpu_python", b"handle_launch", b"handle_executed", b"handle_weight", b"handle_range",
               b"handle_graph", b"handle_memory")
ATTACH_TRIES = 3  # rescans that may try an object whose attach failed (it may have been a process going away)
UPROBE_REF_CTR = Path("/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset")
# Kernel-side counters, by index into the `counters` map (N_COUNTERS in BPF_SOURCE).
COUNTERS = ("lost_launches", "lost_kernels", "weights_unused", "lost_ranges")


# --- the collector ------------------------------------------------------------------------------------------------


@dataclass
class _Attached:
    obj: ProbeObject
    slots: list[int]
    links: list[tuple[int, bytes]] = field(default_factory=list)  # (perf event fd, event name)
    idle_scans: int = 0


def unix_offset_ns() -> int:
    """Unix time minus CLOCK_MONOTONIC, from the tightest of a few bracketing reads."""
    best = None
    for _ in range(3):
        a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        wall = time.time_ns()
        b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if best is None or b - a < best[0]:
            best = (b - a, wall - (a + b) // 2)
    return best[1]


UPROBE_EVENTS = (Path("/sys/kernel/tracing/uprobe_events"), Path("/sys/kernel/debug/tracing/uprobe_events"))
_OUR_EVENT = re.compile(r"^p:uprobes/(fleetprof_(\d+)_\S+)")


def remove_stale_events(files: tuple[Path, ...] = UPROBE_EVENTS) -> int:
    """Remove tracefs uprobe events an earlier agent left behind when it was killed (libbcc falls back to tracefs
    events, which outlive their process): a stale one with another ref_ctr_offset makes the kernel refuse new
    attaches to the same file. Returns how many were removed."""
    removed = 0
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            m = _OUR_EVENT.match(line)
            if m is None or Path(f"/proc/{m.group(2)}").exists():
                continue
            try:
                with open(path, "a") as f:
                    f.write(f"-:uprobes/{m.group(1)}\n")
                removed += 1
            except OSError:  # in use, or already gone
                pass
        break  # both paths are views of the same tracefs
    return removed


class GpuProbeCollector(RecordMaker):
    """Attaches to every loaded object with fleetprof probes and turns their events into GpuLaunch / GpuKernel
    records (producers/gpu_records.py). Call rescan() about every second, poll() every ~100 ms (each call drains
    the ring buffers), end_window() when the agent's window ends, close() at the end; all from one thread (the
    ProcessCache is shared with the CPU collector and is not locked)."""

    name = "gpu"

    def __init__(self, node: str, processes: ProcessCache, max_sites: int = 32, ring_pages: int = 512,
                 idle_scans: int = 6, finder: ProbeFinder | None = None, max_pending: int = 200_000,
                 full_scan_every: int = 10, keep: ProcessFilter = KEEP_ALL, pid: int | None = None,
                 tick_s: float = 0.1, unwind: UnwindLoader | None = None,
                 python: PythonStacks | None = None, identities: Identities | None = None) -> None:
        if not 1 <= max_sites <= MAX_SITES_LIMIT:
            raise ValueError(f"max_sites must be 1..{MAX_SITES_LIMIT}, got {max_sites}")
        if ring_pages < 1 or ring_pages & (ring_pages - 1):
            raise ValueError(f"ring_pages must be a power of two, got {ring_pages}")
        self.node = node
        self.processes = processes
        self.keep = keep
        self.unwind = unwind  # None: launch stacks are walked by frame pointers
        # the CPU sampler's CPython processes (their py_procs entries, which this program reads) and the agent's
        # code-object reader; None: launch stacks get native frames only
        self.python = python
        self.identities = identities  # the launching process's workload identity on each launch (None: 0)
        self.unwinding = FRAME_POINTERS  # how launch stacks are walked, once started
        self.pid = pid  # only this process's records (None: all the filter keeps)
        self.tick_s = tick_s  # how often the rings are drained while something is attached (they are bounded)
        self._next_tick = 0.0
        self.max_sites = max_sites
        self.ring_pages = ring_pages
        self.idle_scans = idle_scans  # full rescans an object may go unmapped everywhere before it is detached
        self.full_scan_every = max(1, full_scan_every)
        self._scans = 0
        self._scanned: set[str] = set()  # the pids the last rescan saw
        self.max_pending = max_pending  # records of each kind one poll reads at most
        self.finder = finder or ProbeFinder()
        self.stats = {k: 0 for k in ("objects_attached", "objects_detached", "sites_attached",
                                     "attach_failures", "objects_without_slots", "polls_cut")}
        self._bpf: Any = None
        self._bcc: Any = None
        self._attach: Any = None
        self._objects: dict[tuple[int, int, int], _Attached] = {}
        self._failed: dict[tuple[int, int, int], int] = {}  # objects whose attach failed: tries so far
        self._waiting: set[tuple[int, int, int]] = set()  # objects that found too few free slots
        self._free = list(range(max_sites))
        self._site_objects: dict[int, ProbeObject] = {}
        self._raw_launches: list[bytes] = []
        self._raw_kernels: list[bytes] = []
        self._raw_ranges: list[bytes] = []
        self._dead_letters: list[dict] = []  # DeadLetter records of rejected kernel records, until drained
        self._mapped: dict[int, Any] = {}  # pid -> the ProcessInfo whose mappings this window's records carried
        self._init_records()

    # lifecycle

    def start(self) -> None:
        """Compile and load the program and open its ring buffers; BpfUnavailable when that cannot work here."""
        bcc = check_bpf()
        arch = platform.machine()
        if arch not in MAX_REG:
            raise BpfUnavailable(f"GPU probes decode arguments on x86_64 and aarch64 only, not {arch}")
        if not UPROBE_REF_CTR.exists():
            raise BpfUnavailable(f"no {UPROBE_REF_CTR}: the kernel cannot count USDT semaphores (needs Linux 4.20+)")
        cflags = [f"-DMAX_SITES={self.max_sites}", f"-DLAUNCH_RING_PAGES={self.ring_pages}",
                  f"-DKERNEL_RING_PAGES={self.ring_pages}", f"-DRANGE_RING_PAGES={self.ring_pages}",
                  f"-DMAX_REG={MAX_REG[arch]}"]
        if self.python is not None and self.python.procs.attached:
            cflags.append("-DPY_EXTERN")  # the CPU sampler's entries: without them, no process has Python frames
        try:
            bpf, self.unwinding = load_unwinding_program(bcc, BPF_SOURCE, cflags, TAIL_CALLED, bcc.BPF.KPROBE,
                                                         self.unwind, "GPU launch stacks")
        except Exception as exc:  # bcc raises plain Exception; its compiler output already went to stderr
            raise BpfUnavailable(f"GPU probe program failed to compile or load: {exc}") from None
        if (stale := remove_stale_events()):
            log.info("removed %d uprobe events left by agents that were killed", stale)
        bpf[b"launches"].open_ring_buffer(self._on_launch)
        bpf[b"kernels"].open_ring_buffer(self._on_kernel)
        bpf[b"ranges"].open_ring_buffer(self._on_range)  # read last: a launch read has its range written before it
        # libbcc's bpf_attach_uprobe takes ref_ctr_offset as a 7th argument, which bcc's Python binding leaves out
        proto = ct.CFUNCTYPE(ct.c_int, ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_ulonglong, ct.c_int,
                             ct.c_uint32)
        self._attach = proto(("bpf_attach_uprobe", bcc.libbcc.lib))
        self._bcc, self._bpf = bcc, bpf
        release_after_compile()

    def close(self) -> None:
        """Detach every object and unload; safe to call twice."""
        if self._bpf is None:
            return
        for key in list(self._objects):
            self._detach(key)
        bpf, self._bpf = self._bpf, None
        bpf.cleanup()

    def __enter__(self) -> GpuProbeCollector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # attaching

    def attached(self) -> dict[str, list[str]]:
        """Attached objects: path -> the probes attached there."""
        return {a.obj.path: sorted(s.probe for s in a.obj.sites) for a in self._objects.values()}

    def rescan(self) -> list[str]:
        """Find objects with probes mapped since the last rescan and attach them; detach those unmapped
        everywhere for `idle_scans` full rescans. Returns the paths attached now.

        Reading every process's maps costs ~2 ms per 70 processes here: every `full_scan_every`-th call reads them
        all (a library loaded later by a running process is found then), the others only processes new since."""
        if self._bpf is None:
            raise RuntimeError("GpuProbeCollector.rescan() before start()")
        full = self._scans % self.full_scan_every == 0
        self._scans += 1
        names = self.finder.process_names()
        if full:
            found = self.finder.scan(names)
            self._scanned = set(names)
        else:
            fresh = [n for n in names if n not in self._scanned]
            self._scanned = set(names)
            found = self.finder.scan(fresh) if fresh else {}
        for key, held in list(self._objects.items()) if full else []:
            held.idle_scans = 0 if key in found else held.idle_scans + 1
            if held.idle_scans > self.idle_scans:
                self._detach(key)
                self.stats["objects_detached"] += 1
                self._waiting.clear()  # slots were freed: objects that found none may fit now
        new = []
        for key, obj in found.items():
            if key in self._objects or key in self._waiting or self._failed.get(key, 0) >= ATTACH_TRIES:
                continue
            if not obj.sites:
                self._failed[key] = ATTACH_TRIES  # only sites this reader cannot decode: nothing to attach
            elif len(obj.sites) > len(self._free):
                self._waiting.add(key)
                self.stats["objects_without_slots"] += 1
                log.warning("%s not attached: %d probe sites, %d free; raise max_sites (now %d, at most %d)",
                            obj.path, len(obj.sites), len(self._free), self.max_sites, MAX_SITES_LIMIT)
            elif self._attach_object(obj):
                new.append(obj.path)
                self._failed.pop(key, None)
            else:
                self._failed[key] = self._failed.get(key, 0) + 1
        if len(self._failed) + len(self._waiting) > self.finder.max_files:
            self._failed.clear()  # bounded: a failure is tried again after many others
            self._waiting.clear()
        return new

    def _attach_object(self, obj: ProbeObject) -> bool:
        """Attach every site of `obj` or none (a failure undoes the others)."""
        held = _Attached(obj, [self._free.pop(0) for _ in obj.sites])
        self._objects[obj.key] = held
        table = self._bpf[b"sites"]
        for site, slot in zip(obj.sites, held.slots, strict=True):
            leaf = table.Leaf()
            for i, arg in enumerate(site.args):
                spec = leaf.args[i]
                spec.disp, spec.kind, spec.size = arg.disp, arg.kind, arg.size
                spec.base, spec.index, spec.scale = arg.base, arg.index, arg.scale
            table[ct.c_int(slot)] = leaf
            self._site_objects[slot] = obj
            event = f"fleetprof_{os.getpid()}_{slot}_{site.offset:x}".encode()
            try:
                fn = self._bpf.load_func(f"{PROBES[site.probe][0]}_{slot}".encode(), self._bcc.BPF.KPROBE)
                fd = self._attach(fn.fd, 0, event, os.fsencode(obj.open_path), site.offset, -1, site.ref_ctr_offset)
            except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception when the verifier refuses
                log.warning("%s: loading the %s program failed: %s", obj.path, site.probe, exc)
                fd = -1
            if fd < 0:
                self.stats["attach_failures"] += 1
                log.warning("%s: attaching %s:%s at 0x%x failed (%d)", obj.path, PROVIDER, site.probe,
                            site.offset, fd)
                self._detach(obj.key)
                return False
            held.links.append((fd, event))
        self.stats["objects_attached"] += 1
        self.stats["sites_attached"] += len(obj.sites)
        log.info("attached %s (%d probe sites)", obj.path, len(obj.sites))
        return True

    def _detach(self, key: tuple[int, int, int]) -> None:
        held = self._objects.pop(key)
        lib = self._bcc.libbcc.lib
        for fd, event in held.links:
            lib.bpf_close_perf_event_fd(fd)
            lib.bpf_detach_uprobe(event)  # removes the tracefs event when libbcc had to fall back to one
        table = self._bpf[b"sites"]
        for slot in held.slots:
            table[ct.c_int(slot)] = table.Leaf()
            self._site_objects.pop(slot, None)
        self._free.extend(held.slots)

    # reading

    def _on_launch(self, _ctx: Any, data: Any, size: int) -> int:
        self._raw_launches.append(ct.string_at(data, size))
        return self._budget(self._raw_launches)

    def _on_kernel(self, _ctx: Any, data: Any, size: int) -> int:
        self._raw_kernels.append(ct.string_at(data, size))
        return self._budget(self._raw_kernels)

    def _on_range(self, _ctx: Any, data: Any, size: int) -> int:
        self._raw_ranges.append(ct.string_at(data, size))
        return self._budget(self._raw_ranges)

    def _budget(self, pending: list[bytes]) -> int:
        # libbpf keeps reading while the producers keep writing: a negative return ends this poll's reading, and
        # what is left stays in the ring for the next poll (a ring that fills loses records, counted)
        if len(pending) < self.max_pending:
            return 0
        self.stats["polls_cut"] += 1
        return -1

    def poll(self, timeout_ms: int = 0) -> tuple[list[dict], list[dict]]:
        """Wait `timeout_ms`, then return the GpuLaunch and GpuKernel records of the events since the last poll.
        The BPF side never wakes the reader (a wake-up per record would cost the launching thread), so call this
        on a timer. A launch record is ~110 bytes plus 8 a frame: the default 2 MiB ring holds ~7,000 of 20 frames,
        so polling every 100 ms keeps up with ~70k sampled launches/s (raise ring_pages beyond that). The kernels
        ring takes every kernel, copy and set of the sampled launches (a graph launch's many), the ranges ring a
        range path (up to 512 bytes) per sampled launch inside NVTX ranges; each ring has ring_pages pages."""
        if self._bpf is None:
            raise RuntimeError("GpuProbeCollector.poll() before start()")
        if timeout_ms > 0:
            time.sleep(timeout_ms / 1000)  # nothing would wake an epoll wait early: the BPF side sends no wake-ups
        cuts = self.stats["polls_cut"]
        self._bpf.ring_buffer_consume()
        raw_launches, self._raw_launches = self._raw_launches, []
        raw_kernels, self._raw_kernels = self._raw_kernels, []
        raw_ranges, self._raw_ranges = self._raw_ranges, []
        launches, kernels = self._records(raw_launches, raw_kernels, raw_ranges, unix_offset_ns(),
                                          self.stats["polls_cut"] != cuts, max(self.max_pending, 65_536))
        self._add_mappings(launches)
        self._add_identities(launches)
        return launches, kernels

    def _add_identities(self, launches: list[dict]) -> None:
        """Each launch carries its process's identity id (looked up once per process and poll)."""
        if self.identities is None:
            return
        ids: dict[int, int] = {}
        for rec in launches:
            pid = rec["pid"]
            found = ids.get(pid)
            if found is None:
                found = ids[pid] = process_identity(self.identities, self.processes.get(pid))
            rec["identity_id"] = found

    def _add_mappings(self, launches: list[dict]) -> None:
        """The first launch of a process this window carries its mappings, and so does the first after they were
        read anew (code mapped later, found by addresses outside them); the others carry []."""
        addrs: dict[int, set[int]] = {}
        first: dict[int, dict] = {}
        for rec in launches:
            addrs.setdefault(rec["pid"], set()).update(a for a in rec["user_addrs"] if a >= 0)  # no mark, no Python
            first.setdefault(rec["pid"], rec)
        for pid, rec in first.items():
            info = self.processes.covering(pid, list(addrs[pid]))
            if self._mapped.get(pid) is info:
                continue
            self._mapped[pid] = info
            anonymous = any(is_anonymous(m.path) for m in info.mappings)
            rec["mappings"] = batch_mappings(info, self.processes.perf_maps.get(pid) if anonymous else None)

    def end_window(self, window: Window | None = None) -> list[Records]:
        """The next launch of each process carries its mappings again."""
        self._mapped.clear()
        self.processes.end_window(window.index if window is not None else None)
        return []

    # the agent's Collector protocol (producers/agent.py)

    def begin(self, wake: Callable[[], None]) -> None:
        self.rescan()  # its rings are drained on a timer while something is attached (due_in): no wake-ups

    def look(self) -> None:
        self.rescan()

    def due_in(self) -> float | None:
        """While something is attached its rings need draining every tick; otherwise only at the window's end."""
        return self._next_tick - time.monotonic() if self._objects else None

    def drain(self) -> list[Records]:
        self._next_tick = time.monotonic() + self.tick_s
        launches, kernels = self.poll(0)
        return [Records("gpu_launches", self._kept(launches)), Records("gpu_kernels", self._kept(kernels)),
                Records("dead_letters", self.take_dead_letters())]

    def take_dead_letters(self) -> list[dict]:
        """The DeadLetter records of kernel records rejected since the last call (see producers/kernel_records.py)."""
        letters, self._dead_letters = self._dead_letters, []
        return letters

    def _kept(self, records: list[dict]) -> list[dict]:
        """The records of the processes the filters keep."""
        if self.pid is None and self.keep == KEEP_ALL:
            return records
        return [r for r in records if (self.pid is None or r["pid"] == self.pid)
                and self.keep.accepts(self.processes.get(r["pid"]))]

    def program_stats(self) -> dict[str, tuple[int, int]]:
        """(run time ns, runs) of the loaded programs by kind (launch, executed, weight, range, graph, memory), from
        /proc/self/fdinfo; both stay 0 unless kernel.bpf_stats_enabled is on."""
        totals: dict[str, tuple[int, int]] = {}
        for name, fn in (self._bpf.funcs.items() if self._bpf is not None else []):
            try:
                with open(f"/proc/self/fdinfo/{fn.fd}") as f:
                    info = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            kind = name.decode().split("_")[0]
            ns, runs = totals.get(kind, (0, 0))
            totals[kind] = (ns + int(info.get("run_time_ns", 0)), runs + int(info.get("run_cnt", 0)))
        return totals

    def counters(self) -> dict[str, int]:
        """Everything counted so far: user side, and what the kernel side could not deliver."""
        out = dict(self.stats, files_parsed=self.finder.parsed, files_unreadable=self.finder.unreadable,
                   sites_unsupported=self.finder.unsupported)
        if self._bpf is not None:
            table = self._bpf[b"counters"]
            out.update((name, int(table[ct.c_int(i)].value)) for i, name in enumerate(COUNTERS))
        return out
