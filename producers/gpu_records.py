"""Turning the GPU probe program's ring-buffer events (producers/bpf/gpu_probes.bpf.c) into GpuLaunch v3 and GpuKernel
v2 records (schemas/gpu_launch.v3.avsc, gpu_kernel.v2.avsc): the collector (producers/gpu_probes.py) reads the
rings, this part decodes what it read.

Three rings: launches (kernel_launch, with the stack), kernels (kernel_executed, graph_kernel_executed and
memory_executed, told apart by a kind field) and ranges (launch_range: the launching thread's NVTX range path).
A range fires right before its kernel_launch on the same thread and is joined to it here by (pid, tid, correlation
id). The ranges ring is read after the launches ring in a poll, so a launch read has its range read too, unless the
poll was cut by its budget (libbpf then stops before the later rings): a launch without a range read in a cut poll is
held until a poll that read every ring (at most max_pending of them), and a range not joined waits one more poll,
then it is dropped and counted.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from producers.kernel_records import (
    implausible_times,
    is_graph_launch,
    kernel_dead_letter,
    kernel_name,
    memory_fields,
    read_process_string,
)
from producers.process_info import process_start_ns
from producers.python_frames import PY_MARK
from schemas.wire import U64_MAX, u32_to_int, u64_to_long, u64_to_longs

if TYPE_CHECKING:
    from producers.probe_finder import ProbeObject
    from producers.python_frames import PythonStacks

NATIVE_STACK = 129  # native frames of a launch's stack at most: 128 and the [truncated] mark (NATIVE_STACK in BPF)
MAX_STACK = NATIVE_STACK + 66  # and its Python part: PY_MARK, 64 frames, the mark (MAX_STACK in BPF_SOURCE)
RANGE_PATH_MAX = 512  # FLEETPROF_RANGE_PATH_MAX: bytes of a range path with its NUL
UNREADABLE_RANGE = "[unreadable range]"
KIND_KERNEL, KIND_GRAPH_KERNEL, KIND_MEMORY = 0, 1, 2  # kernel_event.kind

# The records' fixed parts (struct launch_event / kernel_event / range_event in BPF_SOURCE; a test compares them).
LAUNCH_HEADER = struct.Struct("<QIIIIiIiI64s")  # time, pid, tid, site, correlation, callback, weight, stack bytes
LAUNCH_FIELDS = ("time_ns", "pid", "tid", "site", "correlation_id", "callback_id", "weight", "stack_bytes", "pad",
                 "api_name")
KERNEL_HEADER = struct.Struct("<QQIIIIIiQQQIIII")
KERNEL_FIELDS = ("start_ns", "end_ns", "pid", "site", "correlation_id", "device_id", "stream_id", "name_bytes",
                 "name_addr", "bytes", "graph_node_id", "graph_id", "kind", "memory_kind", "pad")
LAUNCH_SITE_AT = 16  # offset of launch_event.site
RANGE_SITE = struct.Struct("<I")
RANGE_HEADER = struct.Struct("<IIIIiIQ")  # pid, tid, site, correlation, path bytes, pad, path address
RANGE_FIELDS = ("pid", "tid", "site", "correlation_id", "path_bytes", "pad", "path_addr")
RECORD_STATS = ("names_truncated", "names_unreadable", "names_read_from_process", "api_names_unreadable",
                "stacks_missing", "records_malformed", "weights_invalid", "kernel_times_implausible", "copies",
                "sets", "graph_kernels", "graph_launches", "ranges_attached", "ranges_unreadable",
                "ranges_read_from_process", "ranges_unmatched")


def range_path(raw: bytes, stats: dict[str, int]) -> tuple[tuple[int, int, int], str] | None:
    """((pid, tid, correlation id), path) of a range event: what the BPF side read, else the path read from the
    process at its address, else UNREADABLE_RANGE (counted). None for a malformed record."""
    if len(raw) < RANGE_HEADER.size:
        stats["records_malformed"] += 1
        return None
    pid, tid, _site, corr, got, _pad, addr = RANGE_HEADER.unpack_from(raw)
    if got > 0:
        path = raw[RANGE_HEADER.size:RANGE_HEADER.size + got].split(b"\0", 1)[0]
    else:  # a page the process never touched (-EFAULT): the debugger's way faults it in
        found = read_process_string(pid, addr, RANGE_PATH_MAX - 1)
        stats["ranges_read_from_process" if found is not None else "ranges_unreadable"] += 1
        if found is None:
            return (pid, tid, corr), UNREADABLE_RANGE
        path = found
    return (pid, tid, corr), path.decode(errors="replace")


class RecordMaker:
    """The decoding half of GpuProbeCollector: its records from raw ring events. Holds the ranges waiting for their
    launch and the processes' start times."""

    node: str
    stats: dict[str, int]
    python: PythonStacks | None
    _site_objects: dict[int, ProbeObject]
    _dead_letters: list[dict]

    def _init_records(self) -> None:
        self.stats.update((k, 0) for k in RECORD_STATS)
        self._starts: OrderedDict[int, int] = OrderedDict()  # pid -> process_start_ns, last known
        self._ranges: dict[tuple[int, int, int], str] = {}  # read, not yet joined to their launch
        self._ranges_waiting: dict[tuple[int, int, int], str] = {}  # those from the poll before: last chance
        self._held: list[dict] = []  # launches of a cut poll whose range may not have been read yet

    def _records(self, raw_launches: list[bytes], raw_kernels: list[bytes], raw_ranges: list[bytes],
                 offset: int, cut: bool = False, max_held: int = 200_000) -> tuple[list[dict], list[dict]]:
        """The records of one poll's events; `cut`: the poll stopped early, its later rings were not all read."""
        starts: dict[int, int] = {}  # each pid's /proc/PID/stat is read once per poll
        for raw in raw_ranges:
            got = range_path(raw, self.stats)
            if got is not None:
                self._ranges[got[0]] = got[1]
        held, self._held = self._held, []
        for rec in held:  # held: none had a range yet
            rec["nvtx_range"] = self._range_of((rec["pid"], rec["tid"], rec["correlation_id"]))
        fresh = [(r, raw) for r, raw in ((self._launch(raw, offset, starts), raw) for raw in raw_launches)
                 if r is not None]
        kernels = [r for r in (self._kernel(raw, starts) for raw in raw_kernels) if r is not None]
        if cut:  # only an object with a launch_range probe may have sent a range for its launch
            waiting = [r for r in held if not r["nvtx_range"]]
            waiting += [r for r, raw in fresh if not r["nvtx_range"] and self._ranged(raw)]
            if len(waiting) <= max_held:
                self._held = waiting
                held = [r for r in held if r["nvtx_range"]]
                fresh = [(r, raw) for r, raw in fresh if r["nvtx_range"] or not self._ranged(raw)]
        launches = held + [r for r, _ in fresh]
        self.stats["ranges_unmatched"] += len(self._ranges_waiting)
        self._ranges_waiting, self._ranges = self._ranges, {}
        return launches, kernels

    def _range_of(self, key: tuple[int, int, int]) -> str:
        path = self._ranges.pop(key, None)
        if path is None:
            path = self._ranges_waiting.pop(key, None)
        if path is None:
            return ""
        self.stats["ranges_attached"] += 1
        return path

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

    def _ranged(self, raw: bytes) -> bool:
        """Whether the object that sent this launch record has a launch_range probe."""
        obj = self._site_objects.get(RANGE_SITE.unpack_from(raw, LAUNCH_SITE_AT)[0])
        return obj is not None and any(s.probe == "launch_range" for s in obj.sites)

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
        # user addresses, below 2**63, and the walk's [truncated] mark (TRUNCATED_FRAME): as Avro longs, same bits
        stack = array("q", body[:len(body) // 8 * 8]).tolist()
        code_objects: list[dict] = []
        if PY_MARK - (1 << 64) in stack:  # a CPython process's: its Python frames in place
            merged, code_objects = self._python_frames(pid, [a & U64_MAX for a in stack])
            stack = u64_to_longs(merged)
        if not 1 <= weight < 1 << 31:
            self.stats["weights_invalid"] += 1
            weight = 1
        name = api.split(b"\0", 1)[0]
        if not name:
            self.stats["api_names_unreadable"] += 1
        api_name = name.decode(errors="replace")
        graph = is_graph_launch(api_name)
        if graph:
            self.stats["graph_launches"] += 1
        return {"node": self.node, "pid": pid, "tid": tid, "process_start_ns": self._start_ns(pid, starts),
                "time_ns": t + offset, "correlation_id": corr, "callback_id": callback,
                "api_name": api_name, "weight": weight, "nvtx_range": self._range_of((pid, tid, corr)),
                "graph": graph, "identity_id": 0, "user_addrs": stack, "mappings": [], "code_objects": code_objects,
                "simulated": self._simulated(site)}

    def _python_frames(self, pid: int, stack: list[int]) -> tuple[list[int], list[dict]]:
        if self.python is None:  # no reader: the native frames, as without a Python part
            return stack[:stack.index(PY_MARK)], []
        return self.python.rewrite_launch(pid, stack)

    def _kernel(self, raw: bytes, starts: dict[int, int]) -> dict | None:
        if len(raw) < KERNEL_HEADER.size:
            self.stats["records_malformed"] += 1
            return None
        (start, end, pid, site, corr, device, stream, name_bytes, name_addr, size, node_id, graph_id, kind,
         memory_kind, _) = KERNEL_HEADER.unpack_from(raw)
        record: dict[str, Any] = {
            "node": self.node, "pid": pid, "process_start_ns": self._start_ns(pid, starts), "correlation_id": corr,
            "start_ns": u64_to_long(start), "end_ns": u64_to_long(end), "device_id": u32_to_int(device),
            "stream_id": u32_to_int(stream), "kernel_name": "", "activity": "KERNEL", "bytes": 0, "copy_kind": "",
            "memory_kinds": "", "graph_id": graph_id, "graph_node_id": u64_to_long(node_id),
            "simulated": self._simulated(site)}
        if kind == KIND_MEMORY:
            record.update(memory_fields(memory_kind), bytes=u64_to_long(size))
        else:
            record["kernel_name"] = kernel_name(raw[KERNEL_HEADER.size:], name_bytes, pid, name_addr, self.stats)
        why = implausible_times(start, end)
        if why is not None:
            self.stats["kernel_times_implausible"] += 1
            self._dead_letters.append(kernel_dead_letter(record, why))
            return None
        if kind == KIND_MEMORY:
            self.stats["copies" if record["activity"] == "MEMCPY" else "sets"] += 1
        elif kind == KIND_GRAPH_KERNEL:
            self.stats["graph_kernels"] += 1
        return record
