"""The correlator's pending state and the facts its join shares (processors/correlate.py has the rules): limits,
sides and reasons, what one call produced, the pending records of one partition, and the size estimates the
changelog (processors/correlate_changelog.py) is cut by. Pure."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

SECOND_NS = 1_000_000_000
NEVER = -(1 << 63)
FOREVER = (1 << 63) - 1
LAUNCH, KERNEL, PROCESS, STACK = 0, 1, 2, 3
SIDES = ("LAUNCH", "KERNEL")
EXPIRED, LATE, EVICTED, SUPERSEDED = "EXPIRED", "LATE", "EVICTED", "SUPERSEDED"
MAX_KERNEL_NAME = 64 * 1024
MAX_NODE = 1024  # characters of a node name: it is part of every pending entry and every output record
MAX_USER_ADDRS = 1024  # BPF stack walks stop at 127 frames; anything far longer is not a stack
MAX_MAPPINGS = 4096
MAX_MAPPINGS_BYTES = 256 * 1024  # a process's mappings are one changelog item, and it must fit one message
# GPU time is duration x weight in a signed 64-bit long: these two bounds keep one product under 2^62
MAX_WEIGHT = 1 << 20
MAX_DURATION_NS = 1 << 42  # about 73 minutes
MAX_BYTES = 1 << 42  # of one copy or set (4 TiB): bytes x weight stays under 2^62 too
MAX_NVTX_RANGE = 4096  # characters (the probe sends at most 512 bytes): part of every pending launch and sample
MAX_KINDS = 256  # characters of a copy kind and memory kinds together


@dataclass
class Outcome:
    """What one call produced: matches (see `Correlator._match`), unmatched counts, inputs refused or skipped."""

    matches: list[tuple] = field(default_factory=list)
    # (node, pid, event time, side, reason, duration_ns, weight)
    unmatched: list[tuple] = field(default_factory=list)
    invalid: list[tuple[int, str]] = field(default_factory=list)  # (index of the record in the call, reason)
    replayed: int = 0  # records at offsets the state had already seen
    graph_launches: int = 0  # graph launches joined with their first record (every record of theirs is a match)
    ahead_of_clock: int = 0  # records stamped past the clock's ceiling (Correlator.set_clock): matched, not timed


class PartitionState:
    """The pending records of one input partition, in arrival (sequence) order. Entries are lists that lead with
    their sequence number and event time and end with their estimated changelog size."""

    def __init__(self) -> None:
        # [seq, time, weight, addrs, stack no, codes, nvtx range, graph, matches, identity id, size]
        self.launches: OrderedDict[tuple, list] = OrderedDict()
        # [seq, start, end, device, stream, name, simulated, activity, bytes, copy kind, memory kinds, graph id,
        #  graph node id, size], keyed (node, pid, process start, correlation id) or, for a record of a graph,
        # (..., graph node id, start): many of one graph launch wait at once
        self.kernels: OrderedDict[tuple, list] = OrderedDict()
        # correlation key -> the keys of the graph records waiting with it, in arrival order
        self.graph_index: dict[tuple, dict[tuple, None]] = {}
        self.procs: OrderedDict[tuple, list] = OrderedDict()  # [seq, time, mappings, mappings id, size]
        # launch stacks by stack number, each stored once while launches that have it wait: [seq, addrs, refs, size]
        self.stacks: dict[int, list] = {}
        self.tables = (self.launches, self.kernels, self.procs, self.stacks)  # by kind
        self.wm = [NEVER, NEVER]  # largest event time seen per input (launches, kernels)
        self.check_at = FOREVER  # the next expiry scan happens once the cutoff passes this
        self.next_seq = 0
        self.offsets = [-1, -1]  # next input offset per input not yet seen (-1: none seen)
        # changelog bookkeeping (see processors/correlate_changelog.py)
        self.added: dict[int, tuple[int, tuple]] = {}  # seq -> (kind, key): entries not yet in the changelog
        self.removed: list[int] = []  # seqs of entries in the changelog that are gone
        self.updated: dict[int, tuple] = {}  # seq -> key: graph launches in the changelog whose match count moved
        self.state_bytes = 0
        self.log_bytes = 0  # written to the log since the last snapshot
        self.position = 0  # of the next log record
        self.snapshot_position = 0
        self.snapshot_id = 0

    def cutoff(self, horizon_ns: int) -> int:
        return min(self.wm) - horizon_ns  # far below NEVER until both inputs have been seen

    def pending(self) -> tuple[int, int]:
        return len(self.launches), len(self.kernels)

    def table(self, kind: int) -> OrderedDict[tuple, list]:
        return self.tables[kind]

    def insert(self, kind: int, key: tuple, entry: list) -> None:
        """Add an entry (its sequence number already set) at the end of its table."""
        self.tables[kind][key] = entry
        self.added[entry[0]] = (kind, key)
        self.state_bytes += entry[-1]

    def remove(self, kind: int, key: tuple | int) -> list:
        entry = self.tables[kind].pop(key)
        if self.added.pop(entry[0], None) is None:
            self.removed.append(entry[0])
        self.state_bytes -= entry[-1]
        if kind == LAUNCH:
            if entry[7]:
                self.updated.pop(entry[0], None)
            stack = self.stacks[entry[4]]
            stack[2] -= 1
            if stack[2] == 0:
                self.remove(STACK, entry[4])
        elif kind == KERNEL and len(key) > 4:
            self.unindex(key)
        return entry

    def unindex(self, key: tuple) -> None:
        """A waiting graph record left: drop it from the index by correlation key."""
        ckey = key[:4]
        keys = self.graph_index[ckey]
        del keys[key]
        if not keys:
            del self.graph_index[ckey]

    def hold_stack(self, no: int, addrs: tuple, codes: tuple = ()) -> None:
        """A waiting launch has this stack: store it (before the launch, in sequence order) unless stored."""
        stack = self.stacks.get(no)
        if stack is None:
            stack = [self.next_seq, addrs, 0, codes, stack_size(addrs, codes)]
            self.next_seq += 1
            self.insert(STACK, no, stack)
        stack[2] += 1


def launch_size(node: str, nvtx: str = "") -> int:
    """Upper bound of a pending launch's encoded size (ASCII names; the chunk limit leaves room for others)."""
    return 82 + len(node) + len(nvtx)  # 10 of them: the identity id


def stack_size(addrs: tuple, codes: tuple = ()) -> int:
    return 16 + 10 * len(addrs) + sum(16 + len(q) + len(f) for q, f, _ in codes)


def launch_codes(rec: dict) -> tuple:
    """The code objects a launch's Python frames name ((qualname, file, first line), by index), as a key part."""
    codes = rec.get("code_objects")
    if not codes:  # most launches (no Python frames): no generator to build and run
        return ()
    return tuple((c["qualname"], c["file"], c["first_line"]) for c in codes)


def kernel_size(node: str, name: str, kinds: str = "") -> int:
    """Upper bound of a pending kernel's encoded size; `kinds`: its copy kind and memory kinds together."""
    return 112 + len(node) + len(name) + len(kinds)


def process_size(node: str, mappings: list[dict]) -> int:
    return 48 + len(node) + sum(40 + len(m["path"]) + len(m["build_id"]) for m in mappings)


def invalid_launch(rec: dict) -> str | None:
    """Why a decoded GpuLaunch cannot be joined, or None."""
    if len(rec["node"]) > MAX_NODE:
        return f"launch with a node name of {len(rec['node'])} characters (limit {MAX_NODE})"
    if rec["pid"] <= 0:
        return f"launch with pid {rec['pid']}"
    if not 1 <= rec["weight"] <= MAX_WEIGHT:
        return f"launch with weight {rec['weight']} (from 1, standing for itself, to {MAX_WEIGHT})"
    if len(rec["user_addrs"]) > MAX_USER_ADDRS:
        return f"launch stack of {len(rec['user_addrs'])} addresses (limit {MAX_USER_ADDRS})"
    if len(rec["mappings"]) > MAX_MAPPINGS:
        return f"launch with {len(rec['mappings'])} mappings (limit {MAX_MAPPINGS})"
    codes = rec.get("code_objects")
    if codes and (len(codes) > MAX_USER_ADDRS or stack_size((), launch_codes(rec)) > MAX_MAPPINGS_BYTES):
        return f"launch with {len(codes)} code objects over {MAX_USER_ADDRS} or {MAX_MAPPINGS_BYTES} bytes"
    size = process_size(rec["node"], rec["mappings"]) if rec["mappings"] else 0
    if size > MAX_MAPPINGS_BYTES:
        return f"launch with {size} bytes of mappings (limit {MAX_MAPPINGS_BYTES})"
    try:  # subscripts, not .get: this runs for every launch, and decoded records have every field
        nvtx = rec["nvtx_range"]
    except KeyError:
        nvtx = ""
    if len(nvtx) > MAX_NVTX_RANGE:
        return f"launch with an NVTX range of {len(nvtx)} characters (limit {MAX_NVTX_RANGE})"
    return None


def invalid_kernel(rec: dict) -> str | None:
    """Why a decoded GpuKernel cannot be joined, or None."""
    if len(rec["node"]) > MAX_NODE:
        return f"kernel with a node name of {len(rec['node'])} characters (limit {MAX_NODE})"
    if rec["pid"] <= 0:
        return f"kernel with pid {rec['pid']}"
    if rec["end_ns"] < rec["start_ns"]:
        return f"kernel ends {rec['start_ns'] - rec['end_ns']} ns before it starts"
    if rec["end_ns"] - rec["start_ns"] > MAX_DURATION_NS:
        return f"kernel runs {(rec['end_ns'] - rec['start_ns']) / 1e9:.0f} s (limit {MAX_DURATION_NS / 1e9:.0f} s)"
    if not 0 <= rec["device_id"] <= 0xFFFF:
        return f"kernel on device {rec['device_id']}"
    if len(rec["kernel_name"]) > MAX_KERNEL_NAME:
        return f"kernel name of {len(rec['kernel_name'])} characters (limit {MAX_KERNEL_NAME})"
    try:
        activity = rec["activity"]
    except KeyError:
        activity = "KERNEL"
    if activity != "KERNEL":
        if not 0 <= rec.get("bytes", 0) <= MAX_BYTES:
            return f"{rec['activity'].lower()} of {rec['bytes']} bytes (from 0 to {MAX_BYTES})"
        if len(rec.get("copy_kind", "")) + len(rec.get("memory_kinds", "")) > MAX_KINDS:
            return f"{rec['activity'].lower()} with kinds over {MAX_KINDS} characters"
    return None


def count_left(out: Outcome, key: tuple, side: int, reason: str, entry: list) -> None:
    """A record leaves without (more) partners: counted unmatched with its reason, unless it is a graph launch that
    matched at least once (it left matched)."""
    node, pid = key[0], key[1]
    if side == LAUNCH:
        if not entry[8]:
            out.unmatched.append((node, pid, entry[1], LAUNCH, reason, 0, entry[2]))
    else:
        out.unmatched.append((node, pid, entry[1], KERNEL, reason, entry[2] - entry[1], 0))
