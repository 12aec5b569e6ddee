"""GPU launches and kernels from the fleetprof USDT probes (native/include/fleetprof_probes.h), as GpuLaunch and
GpuKernel records (schemas/gpu_launch.v1.avsc, gpu_kernel.v1.avsc).

The kernel side is producers/bpf/gpu_probes.bpf.c (bcc C, compiled once at start()). Here: finding the ELF objects
that carry the probes (every executable file mapping of every process; each file's .note.stapsdt read once per
(device, inode, mtime)), decoding where each probe site keeps its arguments, attaching, and turning ring-buffer
records into schema records.

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
import struct
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from producers.cpu import ProcessCache, as_long, batch_mappings
from producers.cpu_sampler import BpfUnavailable, check_bpf
from producers.memory import release_after_compile
from producers.perf_map import is_anonymous
from producers.process_info import DELETED, mapped_file
from producers.publisher import Publisher
from schemas import topics
from schemas.single_object import encode

log = logging.getLogger("fleetprof.gpu_probes")

BPF_SOURCE = Path(__file__).resolve().parent / "bpf" / "gpu_probes.bpf.c"
PROVIDER = "fleetprof"
# probe name -> (wrapper name prefix in BPF_SOURCE, argument count)
PROBES = {"kernel_launch": ("launch", 3), "kernel_executed": ("executed", 6), "launch_weight": ("weight", 2)}
SIMULATOR_PREFIX = "libfleetprof_gpusim"  # records from the GPU simulator's library are labelled simulated
KERNEL_NAME_MAX = 4096  # characters of a kernel name kept (KERNEL_NAME_MAX in BPF_SOURCE)
MAX_STACK = 127  # user frames of a launch at most (MAX_STACK in BPF_SOURCE)
MAX_SITES_LIMIT = 64  # wrappers written out in BPF_SOURCE
ATTACH_TRIES = 3  # rescans that may try an object whose attach failed (it may have been a process going away)
UPROBE_REF_CTR = Path("/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset")
# Kernel-side counters, by index into the `counters` map (N_COUNTERS in BPF_SOURCE).
COUNTERS = ("lost_launches", "lost_kernels", "weights_unused")

# The records' fixed parts (struct launch_event / kernel_event in BPF_SOURCE; a test compares the two).
LAUNCH_HEADER = struct.Struct("<QIIIIiIiI64s")  # time, pid, tid, site, correlation, callback, weight, stack bytes
LAUNCH_FIELDS = ("time_ns", "pid", "tid", "site", "correlation_id", "callback_id", "weight", "stack_bytes", "pad",
                 "api_name")
KERNEL_HEADER = struct.Struct("<QQIIIIIi")  # start, end, pid, site, correlation, device, stream, name bytes
KERNEL_FIELDS = ("start_ns", "end_ns", "pid", "site", "correlation_id", "device_id", "stream_id", "name_bytes")

ARG_REG, ARG_MEM, ARG_CONST = 1, 2, 3
NO_REG = 0xFF
_S32 = 1 << 32


# --- the probes of one ELF file ---------------------------------------------------------------------------------


class NoteError(ValueError):
    """A file or probe note that cannot be used; the message is one line."""


@dataclass(frozen=True)
class ArgSpec:
    kind: int  # ARG_REG, ARG_MEM, ARG_CONST (as in struct arg_spec)
    size: int = 8
    base: int = NO_REG  # pt_regs word index
    index: int = NO_REG
    scale: int = 1
    disp: int = 0


@dataclass(frozen=True)
class ProbeSite:
    probe: str  # kernel_launch, kernel_executed or launch_weight
    offset: int  # file offset of the probe's instruction: where the uprobe goes
    ref_ctr_offset: int  # file offset of its semaphore (0: none)
    args: tuple[ArgSpec, ...]


@dataclass
class ProbeObject:
    """An ELF file with fleetprof probes, as one process mapped it."""

    key: tuple[int, int, int]  # (device, inode, mtime ns): the file's identity
    path: str  # as the mapping names it
    open_path: str  # where the agent opens it: the path itself if it names the same file here, else via /proc/PID
    sites: list[ProbeSite]
    unsupported: int = 0  # fleetprof probe sites whose arguments this reader cannot decode
    simulated: bool = False


# x86_64: register names -> struct pt_regs word index (r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax
# ip cs flags sp ss). The high-byte registers (ah...) are left out on purpose: the value is not in the low bits.
_X86_REGS = {name: i for i, names in (
    (0, "r15 r15d r15w r15b"), (1, "r14 r14d r14w r14b"), (2, "r13 r13d r13w r13b"), (3, "r12 r12d r12w r12b"),
    (4, "rbp ebp bp bpl"), (5, "rbx ebx bx bl"), (6, "r11 r11d r11w r11b"), (7, "r10 r10d r10w r10b"),
    (8, "r9 r9d r9w r9b"), (9, "r8 r8d r8w r8b"), (10, "rax eax ax al"), (11, "rcx ecx cx cl"),
    (12, "rdx edx dx dl"), (13, "rsi esi si sil"), (14, "rdi edi di dil"), (16, "rip"), (19, "rsp esp sp spl"),
) for name in names.split()}
_X86_RIP = 16
_X86_MEM = re.compile(r"(?:(?P<disp>[-+]?(?:0x[0-9a-fA-F]+|\d+))|(?P<sym>[A-Za-z_.$][\w.$@]*)(?P<add>[-+]\d+)?)?"
                      r"\((?:%(?P<base>\w+))?(?:,%(?P<index>\w+)(?:,(?P<scale>\d+))?)?\)")
# aarch64: x0..x30 and sp, then pc (struct pt_regs starts with user_pt_regs: regs[31], sp, pc).
_ARM_REGS = {**{f"x{i}": i for i in range(31)}, **{f"w{i}": i for i in range(31)}, "sp": 31, "wsp": 31}
_ARM_MEM = re.compile(r"\[(?P<base>\w+)(?:,\s*#?(?P<disp>[-+]?(?:0x[0-9a-fA-F]+|\d+)))?\]")
MAX_REG = {"x86_64": 20, "aarch64": 32}


def _int(text: str) -> int:
    return int(text, 0)


def parse_arg(text: str, arch: str = "x86_64", pc: int = 0, symbols: dict[str, int] | None = None) -> ArgSpec:
    """One `size@operand` of a stapsdt note; `pc` is the probe's address and `symbols` the file's, for operands
    relative to the instruction pointer. NoteError when the operand is not one this reader handles."""
    size_text, at, operand = text.rpartition("@")
    size = abs(_int(size_text)) if at and size_text.lstrip("-+").isdigit() else 8
    if size not in (1, 2, 4, 8):
        raise NoteError(f"argument size {size} in {text!r}")
    if arch == "x86_64":
        if operand.startswith("%"):
            if operand[1:] not in _X86_REGS:
                raise NoteError(f"register {operand!r}")
            return ArgSpec(ARG_REG, size, _X86_REGS[operand[1:]])
        if operand.startswith("$") and re.fullmatch(r"[-+]?(0x[0-9a-fA-F]+|\d+)", operand[1:]):
            return ArgSpec(ARG_CONST, size, disp=_int(operand[1:]))
        m = _X86_MEM.fullmatch(operand)
        if m is None or (m["base"] and m["base"] not in _X86_REGS) or (m["index"] and m["index"] not in _X86_REGS):
            raise NoteError(f"operand {operand!r}")
        base = _X86_REGS[m["base"]] if m["base"] else NO_REG
        disp = _int(m["disp"]) if m["disp"] else 0
        if m["sym"]:  # sym(%rip): the symbol's own address, found from the probe's (the uprobe sees ip == pc)
            if base != _X86_RIP or not symbols or m["sym"] not in symbols:
                raise NoteError(f"symbol operand {operand!r}")
            disp = symbols[m["sym"]] + (int(m["add"]) if m["add"] else 0) - pc
        elif base == _X86_RIP:
            raise NoteError(f"numeric %rip operand {operand!r}")
        index = _X86_REGS[m["index"]] if m["index"] else NO_REG
        return ArgSpec(ARG_MEM, size, base, index, int(m["scale"] or 1), disp)
    if arch == "aarch64":
        if operand in _ARM_REGS:
            return ArgSpec(ARG_REG, size, _ARM_REGS[operand])
        if re.fullmatch(r"#?[-+]?(0x[0-9a-fA-F]+|\d+)", operand):
            return ArgSpec(ARG_CONST, size, disp=_int(operand.lstrip("#")))
        m = _ARM_MEM.fullmatch(operand)
        if m is None or m["base"] not in _ARM_REGS:
            raise NoteError(f"operand {operand!r}")
        return ArgSpec(ARG_MEM, size, _ARM_REGS[m["base"]], disp=_int(m["disp"]) if m["disp"] else 0)
    raise NoteError(f"no argument decoding for {arch}")


def _file_offset(vaddr: int, loads: list[tuple[int, int, int]]) -> int:
    """The file offset of an address inside a PT_LOAD's file-backed part."""
    for offset, start, filesz in loads:
        if start <= vaddr < start + filesz:
            return vaddr - start + offset
    raise NoteError(f"address 0x{vaddr:x} is in no loaded part of the file")


def _symbols(elf: ELFFile) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in (".dynsym", ".symtab"):
        sec = elf.get_section_by_name(name)
        if sec is not None and hasattr(sec, "iter_symbols"):
            out.update((s.name, int(s["st_value"])) for s in sec.iter_symbols() if s.name and s["st_value"])
    return out


def read_probe_sites(path: str, arch: str | None = None) -> tuple[list[ProbeSite], int]:
    """The fleetprof probe sites of an ELF file and how many of them cannot be decoded; ([], 0) for a file without
    them. NoteError (one line) when the file is malformed; OSError when it cannot be read."""
    arch = arch or platform.machine()
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return [], 0
            f.seek(0)
            elf = ELFFile(f)
            notes = elf.get_section_by_name(".note.stapsdt")
            if notes is None:
                return [], 0
            data = notes.data()
            base_sec = elf.get_section_by_name(".stapsdt.base")
            loads = [(int(s["p_offset"]), int(s["p_vaddr"]), int(s["p_filesz"]))
                     for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            end = "<" if elf.little_endian else ">"
            word = "Q" if elf.elfclass == 64 else "I"
            align = 8 if notes["sh_addralign"] == 8 else 4
            sites, unsupported, symbols = [], 0, None
            for desc in _stapsdt_notes(data, end, align):
                pc, note_base, sem = struct.unpack_from(end + word * 3, desc)
                fields = desc[struct.calcsize(word * 3):].split(b"\0")
                if len(fields) < 3 or fields[0] != PROVIDER.encode():
                    continue
                probe, arg_text = fields[1].decode(errors="replace"), fields[2].decode(errors="replace")
                if probe not in PROBES:
                    continue
                if base_sec is not None and note_base:  # prelinked: the note's addresses moved with the file
                    delta = int(base_sec["sh_addr"]) - note_base
                    pc, sem = pc + delta, (sem + delta if sem else 0)
                try:
                    if "(%rip)" in arg_text and symbols is None:
                        symbols = _symbols(elf)
                    args = tuple(parse_arg(a, arch, pc, symbols) for a in arg_text.split())
                    if len(args) != PROBES[probe][1]:
                        raise NoteError(f"{probe} has {len(args)} arguments, not {PROBES[probe][1]}")
                    sites.append(ProbeSite(probe, _file_offset(pc, loads), _file_offset(sem, loads) if sem else 0,
                                           args))
                except NoteError as exc:
                    log.info("%s: probe %s:%s skipped: %s", path, PROVIDER, probe, exc)
                    unsupported += 1
            return sites, unsupported
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyelftools raises many kinds on malformed input
        raise NoteError(f"{path}: malformed ELF: {type(exc).__name__}: {' '.join(str(exc).split())}") from None


def _stapsdt_notes(data: bytes, end: str, align: int) -> list[bytes]:
    """The descriptors of the NT_STAPSDT (3) notes named "stapsdt" in a note section."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(end + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + (namesz + align - 1) // align * align
        if desc_at + descsz > len(data):
            break
        if ntype == 3 and data[name_at:name_at + namesz].rstrip(b"\0") == b"stapsdt":
            out.append(data[desc_at:desc_at + descsz])
        pos = desc_at + (descsz + align - 1) // align * align
    return out


# --- finding the objects ------------------------------------------------------------------------------------------

# start-end perms offset dev inode path, for executable file mappings
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


def process_start_ns(pid: int) -> int:
    """Boot-relative start time of `pid` in ns (/proc/PID/stat starttime), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return int(fields[19]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0


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


def _s32(value: int) -> int:
    """A u32 as the Avro int with the same bits."""
    return value - _S32 if value >= 1 << 31 else value


class GpuProbeCollector:
    """Attaches to every loaded object with fleetprof probes and turns their events into GpuLaunch / GpuKernel
    records. Call rescan() about every second, poll() every ~100 ms (each call drains both ring buffers),
    end_window() when the agent's window ends, close() at the end; all from one thread (the ProcessCache is
    shared with the CPU collector and is not locked)."""

    def __init__(self, node: str, processes: ProcessCache, max_sites: int = 32, ring_pages: int = 512,
                 idle_scans: int = 6, finder: ProbeFinder | None = None, max_pending: int = 200_000,
                 full_scan_every: int = 10) -> None:
        if not 1 <= max_sites <= MAX_SITES_LIMIT:
            raise ValueError(f"max_sites must be 1..{MAX_SITES_LIMIT}, got {max_sites}")
        if ring_pages < 1 or ring_pages & (ring_pages - 1):
            raise ValueError(f"ring_pages must be a power of two, got {ring_pages}")
        self.node = node
        self.processes = processes
        self.max_sites = max_sites
        self.ring_pages = ring_pages
        self.idle_scans = idle_scans  # full rescans an object may go unmapped everywhere before it is detached
        self.full_scan_every = max(1, full_scan_every)
        self._scans = 0
        self._scanned: set[str] = set()  # the pids the last rescan saw
        self.max_pending = max_pending  # records of each kind one poll reads at most
        self.finder = finder or ProbeFinder()
        self.stats = {k: 0 for k in ("objects_attached", "objects_detached", "sites_attached",
                                     "attach_failures", "objects_without_slots", "names_truncated",
                                     "names_unreadable", "api_names_unreadable", "stacks_missing",
                                     "records_malformed", "polls_cut", "weights_invalid")}
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
        self._mapped: dict[int, Any] = {}  # pid -> the ProcessInfo whose mappings this window's records carried
        self._starts: OrderedDict[int, int] = OrderedDict()  # pid -> process_start_ns, last known

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
                  f"-DKERNEL_RING_PAGES={self.ring_pages}", f"-DMAX_REG={MAX_REG[arch]}"]
        try:
            bpf = bcc.BPF(src_file=str(BPF_SOURCE).encode(), cflags=cflags)
        except Exception as exc:  # bcc raises plain Exception; its compiler output already went to stderr
            raise BpfUnavailable(f"GPU probe program failed to compile or load: {exc}") from None
        if (stale := remove_stale_events()):
            log.info("removed %d uprobe events left by agents that were killed", stale)
        bpf[b"launches"].open_ring_buffer(self._on_launch)
        bpf[b"kernels"].open_ring_buffer(self._on_kernel)
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
        so polling every 100 ms keeps up with ~70k sampled launches/s (raise ring_pages beyond that)."""
        if self._bpf is None:
            raise RuntimeError("GpuProbeCollector.poll() before start()")
        if timeout_ms > 0:
            time.sleep(timeout_ms / 1000)  # nothing would wake an epoll wait early: the BPF side sends no wake-ups
        self._bpf.ring_buffer_consume()
        raw_launches, self._raw_launches = self._raw_launches, []
        raw_kernels, self._raw_kernels = self._raw_kernels, []
        offset = unix_offset_ns()
        starts: dict[int, int] = {}  # each pid's /proc/PID/stat is read once per poll
        launches = [r for r in (self._launch(raw, offset, starts) for raw in raw_launches) if r is not None]
        kernels = [r for r in (self._kernel(raw, starts) for raw in raw_kernels) if r is not None]
        self._add_mappings(launches)
        return launches, kernels

    def _start_ns(self, pid: int, starts: dict[int, int]) -> int:
        if pid in starts:
            return starts[pid]
        found = process_start_ns(pid)
        if found:
            self._starts[pid] = found
            self._starts.move_to_end(pid)
            if len(self._starts) > 65_536:
                self._starts.popitem(last=False)
        else:
            found = self._starts.get(pid, 0)  # exited since: what was read while it ran
        starts[pid] = found
        return found

    def _simulated(self, site: int) -> bool:
        obj = self._site_objects.get(site)
        return obj is not None and obj.simulated

    def _launch(self, raw: bytes, offset: int, starts: dict[int, int]) -> dict | None:
        if len(raw) < LAUNCH_HEADER.size:
            self.stats["records_malformed"] += 1
            return None
        t, pid, tid, site, corr, callback, weight, stack_bytes, _, api = LAUNCH_HEADER.unpack_from(raw)
        if stack_bytes <= 8:  # the probe's own address only: no caller's frame could be read
            self.stats["stacks_missing"] += 1
        body = raw[LAUNCH_HEADER.size:LAUNCH_HEADER.size + max(stack_bytes, 0)]
        stack = array("Q", body[:len(body) // 8 * 8]).tolist()  # user addresses: below 2**63, valid Avro longs
        if not 1 <= weight < 1 << 31:
            self.stats["weights_invalid"] += 1
            weight = 1
        name = api.split(b"\0", 1)[0]
        if not name:
            self.stats["api_names_unreadable"] += 1
        return {"node": self.node, "pid": pid, "tid": tid, "process_start_ns": self._start_ns(pid, starts),
                "time_ns": t + offset, "correlation_id": corr, "callback_id": callback,
                "api_name": name.decode(errors="replace"), "weight": weight,
                "user_addrs": stack, "mappings": [], "simulated": self._simulated(site)}

    def _add_mappings(self, launches: list[dict]) -> None:
        """The first launch of a process this window carries its mappings, and so does the first after they were
        read anew (code mapped later, found by addresses outside them); the others carry []."""
        addrs: dict[int, set[int]] = {}
        first: dict[int, dict] = {}
        for rec in launches:
            addrs.setdefault(rec["pid"], set()).update(rec["user_addrs"])
            first.setdefault(rec["pid"], rec)
        for pid, rec in first.items():
            info = self.processes.covering(pid, list(addrs[pid]))
            if self._mapped.get(pid) is info:
                continue
            self._mapped[pid] = info
            anonymous = any(is_anonymous(m.path) for m in info.mappings)
            rec["mappings"] = batch_mappings(info, self.processes.perf_maps.get(pid) if anonymous else None)

    def _kernel(self, raw: bytes, starts: dict[int, int]) -> dict | None:
        if len(raw) < KERNEL_HEADER.size:
            self.stats["records_malformed"] += 1
            return None
        start, end, pid, site, corr, device, stream, name_bytes = KERNEL_HEADER.unpack_from(raw)
        name = raw[KERNEL_HEADER.size:KERNEL_HEADER.size + max(name_bytes, 0)].split(b"\0", 1)[0]
        if name_bytes < 0:
            self.stats["names_unreadable"] += 1
        elif len(name) > KERNEL_NAME_MAX:  # the BPF side read one more character than is kept: it was cut
            self.stats["names_truncated"] += 1
            name = name[:KERNEL_NAME_MAX]
        return {"node": self.node, "pid": pid, "process_start_ns": self._start_ns(pid, starts), "correlation_id": corr,
                "start_ns": as_long(start), "end_ns": as_long(end), "device_id": _s32(device),
                "stream_id": _s32(stream), "kernel_name": name.decode(errors="replace"),
                "simulated": self._simulated(site)}

    def end_window(self) -> None:
        """The next launch of each process carries its mappings again."""
        self._mapped.clear()

    def program_stats(self) -> dict[str, tuple[int, int]]:
        """(run time ns, runs) of the loaded programs by kind (launch, executed, weight), from /proc/self/fdinfo;
        both stay 0 unless kernel.bpf_stats_enabled is on."""
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


def publish(publisher: Publisher, launches: list[dict], kernels: list[dict], sender: Any = None) -> int:
    """Queue the records on gpu.launches / gpu.kernels keyed node/pid, after the symbol tables of new build ids in
    the launches' mappings (through `sender`, an AgentSender, flushed first so no record names a table not yet
    delivered). Returns the messages queued; the caller flushes."""
    with_maps = [{"pid": r["pid"], "mappings": r["mappings"]} for r in launches if r["mappings"]]
    if sender is not None and with_maps:
        sender.send_symbols({"processes": with_maps, "kernel_build_id": ""})
    for rec in launches:
        publisher.publish(topics.GPU_LAUNCHES.name, f"{rec['node']}/{rec['pid']}", encode("GpuLaunch", rec))
    for rec in kernels:
        publisher.publish(topics.GPU_KERNELS.name, f"{rec['node']}/{rec['pid']}", encode("GpuKernel", rec))
    return len(launches) + len(kernels)
