"""What the agent checks in a kernel_executed / graph_kernel_executed / memory_executed record before it becomes a
GpuKernel: the kernel's name, read again from the process when the BPF side could not read it, and its times, which
the probe ABI gives as Unix ns; and how a copy or set is labelled (its kinds in CUPTI's numbering, decoded).

A BPF program cannot fault a page in, so a name in a page the process never touched (a string in a library's
.rodata nobody read yet) comes back as -EFAULT. Reading /proc/PID/mem at drain time faults it in, as a debugger
would; a name that cannot be had that way either (the process is gone, the pointer is bad) is stored as
UNREADABLE_NAME and counted, never as an empty string.

Times (of kernels, copies and sets alike) outside [2000-01-01, now + 1 day], an end before the start, or a kernel
longer than a day are not a clock any GPU runs on: such a record is counted and sent to the dead-letter topic with
the reason, not stored as GPU time.
"""

from __future__ import annotations

import os
import time

from schemas import topics
from schemas.single_object import encode

KERNEL_NAME_MAX = 4096  # characters of a kernel name kept (KERNEL_NAME_MAX in producers/bpf/gpu_probes.bpf.c)
UNREADABLE_NAME = "[unreadable kernel name]"
EARLIEST_NS = 946_684_800 * 10**9  # 2000-01-01T00:00:00Z
DAY_NS = 86_400 * 10**9
PAGE = 4096

# CUPTI's CUpti_ActivityMemcpyKind, and CUpti_ActivityMemoryKind (6 and 7 are the static forms of 3 and 5).
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP"}
MEMORY_KINDS = {1: "pageable", 2: "pinned", 3: "device", 4: "array", 5: "managed", 6: "device", 7: "managed"}
MEMORY_IS_SET = 0x100  # FLEETPROF_MEMORY_IS_SET
MEMSET_LABEL = "[memset]"
# The launch APIs whose one correlation id stands for every kernel, copy and set their graph replays.
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cudaGraphLaunch_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
                               "gpusimGraphLaunch (simulated)"})


def is_graph_launch(api_name: str) -> bool:
    """Whether a launch by `api_name` is a CUDA graph launch (runtime or driver API, per-thread-stream or not, or the
    GPU simulator's)."""
    return api_name in GRAPH_LAUNCH_APIS


def memory_fields(memory_kind: int) -> dict:
    """The GpuKernel fields of a copy or set from memory_executed's memory_kind (FLEETPROF_MEMORY_KIND: copy kind in
    bits 0-7, bit 8 a set, source memory kind in bits 16-23, destination in 24-31)."""
    src = MEMORY_KINDS.get((memory_kind >> 16) & 0xFF, "unknown")
    dst = MEMORY_KINDS.get((memory_kind >> 24) & 0xFF, "unknown")
    if memory_kind & MEMORY_IS_SET:
        return {"activity": "MEMSET", "kernel_name": MEMSET_LABEL, "copy_kind": "", "memory_kinds": dst}
    copy = COPY_KINDS.get(memory_kind & 0xFF, "unknown")
    return {"activity": "MEMCPY", "kernel_name": f"[memcpy {copy}]", "copy_kind": copy,
            "memory_kinds": f"{src}>{dst}"}


def kernel_name(sent: bytes, name_bytes: int, pid: int, name_addr: int, stats: dict[str, int]) -> str:
    """A kernel record's name: what the BPF side `sent` (`name_bytes`: its read's result, -errno when it failed),
    else read from the process at `name_addr`, else UNREADABLE_NAME; cut at KERNEL_NAME_MAX (both reads take one
    more character, so a cut is known). Counted in `stats`: names_read_from_process, names_unreadable,
    names_truncated."""
    name: bytes | None = sent[:max(name_bytes, 0)].split(b"\0", 1)[0]
    if name_bytes < 0:
        name = read_process_string(pid, name_addr, KERNEL_NAME_MAX + 1)
        stats["names_read_from_process" if name is not None else "names_unreadable"] += 1
        if name is None:
            return UNREADABLE_NAME
    if len(name) > KERNEL_NAME_MAX:
        stats["names_truncated"] += 1
        name = name[:KERNEL_NAME_MAX]
    return name.decode(errors="replace")


def read_process_string(pid: int, addr: int, limit: int) -> bytes | None:
    """The NUL-terminated string at `addr` in process `pid`, at most `limit` bytes of it (a longer one is cut at
    limit), or None when its first page cannot be read. Read page by page, so a string that ends just before an
    unmapped page is still read whole."""
    if addr == 0:
        return None
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    out = bytearray()
    try:
        while len(out) < limit:
            at = addr + len(out)
            want = min(PAGE - at % PAGE, limit - len(out))
            try:
                chunk = os.pread(fd, want, at)
            except (OSError, OverflowError):
                chunk = b""
            if not chunk:
                break
            end = chunk.find(b"\0")
            if end >= 0:
                return bytes(out + chunk[:end])
            out += chunk
    finally:
        os.close(fd)
    return bytes(out) if out else None


def implausible_times(start_ns: int, end_ns: int, now_ns: int | None = None) -> str | None:
    """Why a kernel's (start, end) are not plausible Unix ns, or None when they are."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    if start_ns < EARLIEST_NS:
        return f"start_ns {start_ns} is before 2000-01-01: not Unix ns (the probe ABI's clock)"
    if end_ns > now_ns + DAY_NS:
        return f"end_ns {end_ns} is more than a day after now ({now_ns}): not Unix ns"
    if end_ns < start_ns:
        return f"end_ns {end_ns} is before start_ns {start_ns}"
    if end_ns - start_ns > DAY_NS:
        return f"a kernel of {(end_ns - start_ns) / 1e9:.0f} s (start_ns {start_ns}, end_ns {end_ns}): over a day"
    return None


def kernel_dead_letter(record: dict, reason: str) -> dict:
    """The DeadLetter for a GpuKernel record the agent would not send: the record itself, encoded as it would have
    been, so it can be looked at or replayed."""
    return {"stage": "agent", "source_topic": topics.GPU_KERNELS.name, "source_partition": -1, "source_offset": -1,
            "key": f"{record['node']}/{record['pid']}".encode(), "value": encode("GpuKernel", record),
            "reason": reason, "time_ns": time.time_ns()}
