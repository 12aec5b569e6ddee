"""The eBPF CPU sampler: a software perf_event per CPU, stacks counted in the kernel, drained per window.

The kernel side is producers/bpf/cpu_sampler.bpf.c (bcc C, compiled at start()). bcc is imported lazily so that
everything else in fleetprof imports on machines without it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from producers.memory import release_after_compile
from producers.unwind_program import FRAME_POINTERS, load_unwinding_program
from schemas.wire import LOST_STACK_FRAME

if TYPE_CHECKING:
    from producers.python_procs import PythonProcs
    from producers.unwind_maps import UnwindLoader

log = logging.getLogger("fleetprof.cpu_sampler")

BPF_SOURCE = Path(__file__).resolve().parent / "bpf" / "cpu_sampler.bpf.c"
# Field names of `struct key_t` in BPF_SOURCE, in order (tests check the compiled struct against this).
KEY_FIELDS = ("pid", "tid", "user_stack", "user_status", "kernel_stack_id")
LOST_USER_STACK = (LOST_STACK_FRAME,)  # a sample whose user stack the full stack map lost
DEFAULT_MAX_ENTRIES = 10240
RING_POLL_MS = 1000  # the new-pid reader's longest wait: how soon close() gets it back
MIN_STACK_ENTRIES, MAX_STACK_ENTRIES = 16384, 1 << 20
# A stack map is a hash table without chaining: a stack whose bucket holds another stack is lost (-EEXIST). With
# D distinct stacks in E buckets about D/(2E) of the samples collide, and D is at most the samples of one look (the
# maps are emptied every second): E = 64 x samples per second keeps collisions under ~1%.
STACK_ENTRIES_PER_SAMPLE = 64

# (pid, tid, user addresses leaf first, kernel addresses leaf first, count)
Sample = tuple[int, int, list[int], list[int], int]


class BpfUnavailable(RuntimeError):
    """BPF cannot run here; the message is one line saying what is missing."""


def _bcc_path_dirs() -> list[Path]:
    # infra/setup.sh puts a folder holding only a `bcc` symlink in the venv, so the venv sees Debian's bcc without
    # all of /usr/lib/python3/dist-packages (whose other packages could shadow the venv's).
    repo = Path(__file__).resolve().parent.parent
    return [Path(sys.prefix) / "bcc-path", repo / ".venv" / "bcc-path"]


def import_bcc() -> Any:
    """The bcc module, or BpfUnavailable saying it is missing."""
    try:
        import bcc
        return bcc
    except ImportError:
        pass
    for folder in _bcc_path_dirs():
        if (folder / "bcc").exists() and str(folder) not in sys.path:
            sys.path.append(str(folder))
    try:
        import bcc
    except ImportError:
        raise BpfUnavailable("no bcc Python module (Debian python3-bpfcc; run infra/setup.sh as root)") from None
    except Exception as exc:  # bcc raises plain Exception when libbcc.so is missing
        raise BpfUnavailable(f"bcc failed to load: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    return bcc


def check_bpf() -> Any:
    """Everything bcc needs, checked up front so the error names the missing piece; returns the bcc module."""
    bcc = import_bcc()
    build = Path("/lib/modules") / platform.release() / "build"
    if not (build / "include").is_dir():
        raise BpfUnavailable(f"no kernel headers at {build} (run infra/setup.sh as root)")
    if os.geteuid() != 0:
        raise BpfUnavailable("not root: loading BPF programs needs root (or CAP_BPF + CAP_PERFMON)")
    return bcc


def default_stack_entries(frequency_hz: int, cpus: int | None = None) -> int:
    """Stack map entries for this many CPUs sampled at `frequency_hz`: a power of two from 16,384 to 1,048,576
    (each entry holds 127 frames: ~1 KiB of kernel memory, twice for the double buffer)."""
    want = STACK_ENTRIES_PER_SAMPLE * frequency_hz * (cpus or os.cpu_count() or 1)
    return min(MAX_STACK_ENTRIES, max(MIN_STACK_ENTRIES, 1 << (want - 1).bit_length()))


class CpuSampler:
    """Samples every CPU at `frequency_hz`; drain() returns the stacks counted since the last drain, new_pids() the
    processes sampled for the first time since the last call."""

    def __init__(self, frequency_hz: int = 19, pid_filter: int | None = None,
                 max_entries: int = DEFAULT_MAX_ENTRIES, stack_entries: int | None = None,
                 unwind: UnwindLoader | None = None, python: PythonProcs | None = None) -> None:
        if not 1 <= frequency_hz <= 10_000:
            raise ValueError(f"frequency must be 1..10000 Hz, got {frequency_hz}")
        self.frequency_hz = frequency_hz
        self.pid_filter = pid_filter
        self.max_entries = max_entries
        self.stack_entries = stack_entries or default_stack_entries(frequency_hz)
        self.unwind = unwind  # None: user stacks are walked by frame pointers
        self.unwinding = FRAME_POINTERS  # how user stacks are walked, once started
        self.python = python  # the CPython processes whose Python frames are walked (None: none are)
        self._announced: list[int] = []
        self._announced_lock = threading.Lock()
        self.on_new_pid: Callable[[], None] | None = None  # called on the ring's thread when a pid is announced
        self._ring_thread: threading.Thread | None = None
        self._closing = threading.Event()
        self.lost_samples = 0  # last drain: samples whose stack did not fit the stack map (collision)
        self.dropped_samples = 0  # last drain: samples not counted because the counts map was full
        self._bpf: Any = None
        self._bcc: Any = None
        # this window so far: (pid, tid, user addrs, kernel addrs) -> count, and its lost / dropped samples
        self._pending: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], int] = {}
        self._lost = 0
        self._dropped = 0

    def start(self) -> None:
        """Compile, load and attach; BpfUnavailable when that cannot work here. When the kernel refuses the table
        unwinder, one line says why and user stacks are walked by frame pointers."""
        bcc = check_bpf()
        cflags = [f"-DMAX_ENTRIES={int(self.max_entries)}", f"-DSTACK_ENTRIES={int(self.stack_entries)}"]
        if self.pid_filter is not None:
            cflags.append(f"-DFILTER_PID={int(self.pid_filter)}")
        try:
            bpf, self.unwinding = load_unwinding_program(bcc, BPF_SOURCE, cflags, (b"cpu_unwind", b"cpu_python"),
                                                         bcc.BPF.PERF_EVENT,
                                                         self.unwind, "user stacks")
        except Exception as exc:  # bcc raises plain Exception; its compiler output already went to stderr
            raise BpfUnavailable(f"BPF program failed to compile or load: {exc}") from None
        try:
            bpf.attach_perf_event(ev_type=bcc.PerfType.SOFTWARE, ev_config=bcc.PerfSWConfig.CPU_CLOCK,
                                  fn_name=b"on_cpu_clock", sample_freq=self.frequency_hz, cpu=-1)
        except Exception as exc:
            bpf.cleanup()
            raise BpfUnavailable(f"attaching the CPU clock perf_event failed: {exc}") from None
        if self.python is not None:
            self.python.attach(bpf)
        bpf[b"new_pids"].open_ring_buffer(self._on_new_pid)
        self._bcc, self._bpf = bcc, bpf
        release_after_compile()  # LLVM's pages and heap are not needed again: the agent's RSS drops by ~130 MB
        self._ring_thread = threading.Thread(target=self._read_new_pids, args=(bpf,), name="fleetprof-new-pids",
                                             daemon=True)
        self._ring_thread.start()

    def _read_new_pids(self, bpf: Any) -> None:
        """Wait on the new-pid ring (epoll: the BPF side wakes it) and take each announcement as it comes. A thread
        of its own, so the agent's loop sleeps until something happens instead of looking every 100 ms."""
        while not self._closing.is_set():
            bpf.ring_buffer_poll(RING_POLL_MS)

    def _flip(self) -> int:
        """Send new samples to the other map pair; returns the generation whose maps now hold the finished window."""
        table = self._bpf[b"generation"]
        old = int(table[0].value)
        table[0] = table.Leaf(old + 1)
        # A sample that read the old generation just before the flip is still being counted on another CPU:
        # perf_event BPF programs run for microseconds, so a millisecond is ample before reading its maps.
        time.sleep(0.001)
        return old & 1

    def _on_new_pid(self, _ctx: Any, data: Any, size: int) -> int:
        if size >= 4:
            with self._announced_lock:
                self._announced.append(ctypes.c_uint32.from_address(data).value)
            if self.on_new_pid is not None:
                self.on_new_pid()
        return 0

    @property
    def announced(self) -> bool:
        """Whether new_pids() has something to return."""
        return bool(self._announced)

    def new_pids(self) -> list[int]:
        """Processes whose first sample (or first after exec) came since the last call, in order."""
        if self._bpf is None:
            raise RuntimeError("CpuSampler.new_pids() before start()")
        with self._announced_lock:
            found, self._announced = self._announced, []
        return found

    def pids(self) -> set[int]:
        """Processes sampled since the last drain, as of the last collect()."""
        return {key[0] for key in self._pending}

    def collect(self) -> None:
        """Move what the kernel counted so far into this window's totals, and empty those maps. Called every
        second or so within a window: the fewer distinct stacks a stack map holds, the fewer collide (a collision
        loses that sample's stack), and the new processes are known within the second."""
        if self._bpf is None:
            raise RuntimeError("CpuSampler.collect() before start()")
        done = self._flip()
        counts, stacks = self._bpf[f"counts{done}".encode()], self._bpf[f"stacks{done}".encode()]
        ustacks = self._bpf[f"ustacks{done}".encode()]
        items = [(k, v.value) for k, v in counts.items()]
        kernel: dict[int, tuple[int, ...]] = {}
        user: dict[int, tuple[int, ...]] = {}
        for key, count in items:
            if key.user_status == 0:
                if key.user_stack not in user:
                    try:
                        leaf = ustacks[ustacks.Key(key.user_stack)]
                        user[key.user_stack] = tuple(leaf.addrs[:min(leaf.len, len(leaf.addrs))])
                    except KeyError:
                        user[key.user_stack] = ()
                user_addrs = user[key.user_stack] or LOST_USER_STACK
            elif key.user_status == -errno.EFAULT:  # no user stack: a kernel thread
                user_addrs = ()
            else:  # lost: the stack map was full
                user_addrs = LOST_USER_STACK
            lost = user_addrs is LOST_USER_STACK
            sid = key.kernel_stack_id
            if sid < 0:
                # -EFAULT: no kernel stack (a user-mode sample); anything else was lost
                lost = lost or sid != -errno.EFAULT
                kernel_addrs: tuple[int, ...] = ()
            else:
                if sid not in kernel:
                    try:
                        kernel[sid] = tuple(stacks.walk(sid))
                    except KeyError:
                        kernel[sid] = ()
                kernel_addrs = kernel[sid]
                lost = lost or not kernel_addrs
            if lost:
                self._lost += count
                if user_addrs is not LOST_USER_STACK:  # the kernel part is gone: the mark ends the user part
                    user_addrs = (LOST_STACK_FRAME, *user_addrs)
            whole = (int(key.pid), int(key.tid), user_addrs, kernel_addrs)
            self._pending[whole] = self._pending.get(whole, 0) + int(count)
        # Nothing writes to this set until the next flip: clearing it loses nothing, and frees the stack slots.
        counts.clear()
        dropped_table = self._bpf[b"dropped"]
        dropped = int(dropped_table[done].value)
        if dropped:
            dropped_table[done] = dropped_table.Leaf(0)
            self._dropped += dropped
        # bcc's StackTrace.clear() does nothing, so the stack ids are deleted one by one: a stack map never emptied
        # fills up within minutes, and then most new stacks collide (-EEXIST) and are lost. The counts name every id
        # in use, except those of samples the full counts map dropped: listing the maps' keys (a syscall and a Python
        # object each) is left for then.
        for table, ids in ((stacks, kernel), (ustacks, user)):
            for key in list(table.keys()) if dropped else [table.Key(i) for i in ids]:
                try:
                    del table[key]
                except KeyError:
                    pass

    def drain(self) -> list[Sample]:
        """Counts since the last drain, with stacks resolved to addresses; starts the next window."""
        self.collect()
        out = [(pid, tid, list(user), list(kernel), count)
               for (pid, tid, user, kernel), count in self._pending.items()]
        self._pending = {}
        self.lost_samples, self.dropped_samples, self._lost, self._dropped = self._lost, self._dropped, 0, 0
        if self.dropped_samples:
            log.warning("%d samples dropped: the counts map is full; raise --count-entries "
                        "(FLEETPROF_AGENT_COUNT_ENTRIES, now %d)", self.dropped_samples, self.max_entries)
        if self.lost_samples:
            log.warning("%d samples lost their stack (stack map collisions); raise --stack-entries "
                        "(FLEETPROF_AGENT_STACK_ENTRIES, now %d)", self.lost_samples, self.stack_entries)
        return out

    def close(self) -> None:
        """Detach and unload; safe to call twice."""
        if self._bpf is None:
            return
        bpf, self._bpf = self._bpf, None
        self._closing.set()
        if self._ring_thread is not None:  # it polls the ring that cleanup() frees
            self._ring_thread.join()
        try:
            bpf.detach_perf_event(ev_type=self._bcc.PerfType.SOFTWARE, ev_config=self._bcc.PerfSWConfig.CPU_CLOCK)
        finally:
            bpf.cleanup()

    def __enter__(self) -> CpuSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
