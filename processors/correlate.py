"""correlate: sampled CUDA launches joined with the kernels they ran. Pure: records in, matches and counts out; the
state goes to and from changelog records in processors/correlate_changelog.py, and processors/correlate_stage.py does
every read and write.

A launch and a kernel pair on (node, pid, process_start_ns, correlation_id). gpu.launches and gpu.kernels are keyed
node/pid with the same partition count, so partition p of both reaches one consumer: state is kept per partition.

The rules, all in event time (nothing here reads a clock), so that every record leaves exactly once, either matched
or counted unmatched with a reason:
- A partition's watermark is the smaller of its two inputs' largest event times (launch time_ns, kernel start_ns), as
  for any two-input operator: an input read ahead of the other does not expire the other's records. cutoff =
  watermark - horizon.
- A record whose partner is pending matches at once, however old. Otherwise it waits, unless it is already older
  than the cutoff (LATE). Waiting records older than the cutoff leave as EXPIRED (scanning from the oldest arrival,
  so one stuck behind a newer arrival leaves when that one does); past max_pending per side the oldest leave as
  EVICTED. Of two records of one side with one key the older leaves as SUPERSEDED (a duplicate, a reused pid).
- process_start_ns tells a reused pid apart. Old writers send 0: then a pair must also fit in time (the kernel starts
  within [launch - skew, launch + horizon]); if not, the older record belongs to an earlier process: SUPERSEDED.
- A process's mappings come with some launches only ([] when sent earlier in the window): the last list per
  (node, pid, process_start_ns) is kept, refreshed by every launch that carries one, at most max_processes per
  partition (least recently refreshed out) and mappings_ttl past its last refresh. A waiting launch's stack is kept
  once for all the waiting launches that have it (launch stacks repeat).

Exactly once across crashes (correlate_stage.py does the I/O): after each call, `correlate_changelog.changelog`
returns the state's changes as CorrelatorState records: a LOG record of what was added and removed since the previous
one (with the watermarks, sequence counter and next input offsets), or, once the log since the last snapshot outweighs
the state, a SNAPSHOT of the whole state. The stage writes them to the compacted correlate.state topic in the same
Kafka transaction as the output and the input offsets, so the committed changelog always describes the state after
exactly the committed offsets. Keys form a fixed space per partition (snapshot chunks, and a ring of log slots that a
snapshot frees before it wraps), so compaction bounds the topic without tombstones. `correlate_changelog.restore`
rebuilds a partition from them: the latest snapshot, then the log records after it in order, entries keeping their
arrival order, so the restored state is the one the commit left.
"""

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


@dataclass(frozen=True)
class CorrelateConfig:
    horizon_ns: int = 60 * SECOND_NS  # how long one side waits for the other, in event time
    window_ns: int = 10 * SECOND_NS  # output windows (of kernel start times)
    max_pending: int = 20_000  # per side and partition
    max_processes: int = 10_000  # mappings kept per partition
    mappings_ttl_ns: int = 600 * SECOND_NS
    skew_ns: int = SECOND_NS  # process_start_ns 0 only: how far before its launch a kernel may seem to start
    log_slots: int = 4096  # changelog log keys per partition; a snapshot comes before half are used
    snapshot_min_bytes: int = 1 << 20  # no snapshot before the log since the last one reaches this (or 2x the state)
    chunk_bytes: int = 200 * 1024  # changelog records stay well under Kafka's 1 MB message limit

    def __post_init__(self) -> None:
        for name in ("horizon_ns", "window_ns", "max_pending", "max_processes", "mappings_ttl_ns", "log_slots",
                     "snapshot_min_bytes", "chunk_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"correlate setting {name} must be >= 1, got {getattr(self, name)}")
        if self.log_slots < 4:
            raise ValueError(f"correlate setting log_slots must be >= 4, got {self.log_slots}")


@dataclass
class Outcome:
    """What one call produced: matches (see `Correlator._match`), unmatched counts, inputs refused or skipped."""

    matches: list[tuple] = field(default_factory=list)
    # (node, pid, event time, side, reason, duration_ns, weight)
    unmatched: list[tuple] = field(default_factory=list)
    invalid: list[tuple[int, str]] = field(default_factory=list)  # (index of the record in the call, reason)
    replayed: int = 0  # records at offsets the state had already seen


class PartitionState:
    """The pending records of one input partition, in arrival (sequence) order. Entries are lists that lead with
    their sequence number and event time and end with their estimated changelog size."""

    def __init__(self) -> None:
        self.launches: OrderedDict[tuple, list] = OrderedDict()  # [seq, time, weight, addrs, stack no, size]
        # [seq, start, end, device, stream, name, simulated, size]
        self.kernels: OrderedDict[tuple, list] = OrderedDict()
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
            stack = self.stacks[entry[4]]
            stack[2] -= 1
            if stack[2] == 0:
                self.remove(STACK, entry[4])
        return entry

    def hold_stack(self, no: int, addrs: tuple, codes: tuple = ()) -> None:
        """A waiting launch has this stack: store it (before the launch, in sequence order) unless stored."""
        stack = self.stacks.get(no)
        if stack is None:
            stack = [self.next_seq, addrs, 0, codes, stack_size(addrs, codes)]
            self.next_seq += 1
            self.insert(STACK, no, stack)
        stack[2] += 1


def launch_size(node: str) -> int:
    """Upper bound of a pending launch's encoded size (ASCII names; the chunk limit leaves room for others)."""
    return 64 + len(node)


def stack_size(addrs: tuple, codes: tuple = ()) -> int:
    return 16 + 10 * len(addrs) + sum(16 + len(q) + len(f) for q, f, _ in codes)


def launch_codes(rec: dict) -> tuple:
    """The code objects a launch's Python frames name ((qualname, file, first line), by index), as a key part."""
    return tuple((c["qualname"], c["file"], c["first_line"]) for c in rec.get("code_objects") or ())


def kernel_size(node: str, name: str) -> int:
    return 80 + len(node) + len(name)


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
    codes = rec.get("code_objects") or ()
    if len(codes) > MAX_USER_ADDRS or stack_size((), launch_codes(rec)) > MAX_MAPPINGS_BYTES:
        return f"launch with {len(codes)} code objects over {MAX_USER_ADDRS} or {MAX_MAPPINGS_BYTES} bytes"
    size = process_size(rec["node"], rec["mappings"]) if rec["mappings"] else 0
    if size > MAX_MAPPINGS_BYTES:
        return f"launch with {size} bytes of mappings (limit {MAX_MAPPINGS_BYTES})"
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
    return None


class Correlator:
    """The join over every partition this instance holds."""

    def __init__(self, config: CorrelateConfig | None = None) -> None:
        self.config = config or CorrelateConfig()
        self.parts: dict[int, PartitionState] = {}
        # mapping lists by content -> an id that is never reused, so caches keyed by it cannot go stale
        self._mapping_ids: dict[tuple, int] = {}
        self._next_mapping_id = 1
        self._stacks: dict[tuple, tuple[tuple, int]] = {}
        self._next_stack = 1

    def state(self, partition: int) -> PartitionState:
        st = self.parts.get(partition)
        if st is None:
            st = self.parts[partition] = PartitionState()
        return st

    def process(self, partition: int, side: int, offset: int, record: dict, out: Outcome, index: int = 0) -> None:
        """Take one launch (side LAUNCH) or kernel (side KERNEL) record read at `offset` of `partition`."""
        st = self.parts.get(partition) or self.state(partition)
        if offset >= 0:
            if offset < st.offsets[side]:
                out.replayed += 1  # already in the state (it was restored past this offset)
                return
            st.offsets[side] = offset + 1
        reason = invalid_launch(record) if side == LAUNCH else invalid_kernel(record)
        if reason is not None:
            out.invalid.append((index, reason))
            return
        if side == LAUNCH:
            self._launch(st, record, out)
        else:
            self._kernel(st, record, out)
        if min(st.wm) - self.config.horizon_ns > st.check_at:
            self._expire(st, out)

    def _launch(self, st: PartitionState, rec: dict, out: Outcome) -> None:
        cfg = self.config
        node, pid, start, t = rec["node"], rec["pid"], rec["process_start_ns"], rec["time_ns"]
        if rec["mappings"]:
            self._set_mappings(st, (node, pid, start), t, rec["mappings"])
        key = (node, pid, start, rec["correlation_id"])
        if t > st.wm[LAUNCH]:
            st.wm[LAUNCH] = t
        kern = st.kernels.get(key)
        if kern is not None:
            ks = kern[1]
            if start or t - cfg.skew_ns <= ks <= t + cfg.horizon_ns:
                st.remove(KERNEL, key)
                self._match(st, key, rec["weight"], self.stack_no(rec["user_addrs"], launch_codes(rec)), kern, out)
                return
            if ks > t:  # the kernel belongs to a later process with this pid: this launch is the stale one
                out.unmatched.append((node, pid, t, LAUNCH, SUPERSEDED, 0, rec["weight"]))
                return
            st.remove(KERNEL, key)
            out.unmatched.append((node, pid, ks, KERNEL, SUPERSEDED, kern[2] - ks, 0))
        addrs, no, codes = self.stack_no(rec["user_addrs"], launch_codes(rec))
        self._wait(st, LAUNCH, key, [0, t, rec["weight"], addrs, no, codes, 64 + len(node)], out)  # launch_size

    def _kernel(self, st: PartitionState, rec: dict, out: Outcome) -> None:
        cfg = self.config
        node, pid, start, s = rec["node"], rec["pid"], rec["process_start_ns"], rec["start_ns"]
        key = (node, pid, start, rec["correlation_id"])
        if s > st.wm[KERNEL]:
            st.wm[KERNEL] = s
        name = rec["kernel_name"]
        size = 80 + len(node) + len(name)  # kernel_size, inline
        kern = [0, s, rec["end_ns"], rec["device_id"], rec["stream_id"] & 0xFFFFFFFF, name,
                bool(rec.get("simulated", False)), size]
        launch = st.launches.get(key)
        if launch is not None:
            lt = launch[1]
            if start or lt - cfg.skew_ns <= s <= lt + cfg.horizon_ns:
                st.remove(LAUNCH, key)
                self._match(st, key, launch[2], (launch[3], launch[4], launch[5]), kern, out)
                return
            if lt > s:  # the launch belongs to a later process with this pid: this kernel is the stale one
                out.unmatched.append((node, pid, s, KERNEL, SUPERSEDED, rec["end_ns"] - s, 0))
                return
            st.remove(LAUNCH, key)
            out.unmatched.append((node, pid, lt, LAUNCH, SUPERSEDED, 0, launch[2]))
        self._wait(st, KERNEL, key, kern, out)

    def _wait(self, st: PartitionState, side: int, key: tuple, entry: list, out: Outcome) -> None:
        """Make a record wait for its partner (or count it late, or settle a duplicate key), then keep bounds."""
        t = entry[1]
        if t < min(st.wm) - self.config.horizon_ns:
            out.unmatched.append(_unmatched(key, side, LATE, entry))
            return
        table = st.tables[side]
        old = table.get(key)
        if old is not None:
            if old[1] > t:  # the waiting one is newer: keep it
                out.unmatched.append(_unmatched(key, side, SUPERSEDED, entry))
                return
            out.unmatched.append(_unmatched(key, side, SUPERSEDED, st.remove(side, key)))
        if side == LAUNCH:
            st.hold_stack(entry[4], entry[3], entry[5])
        entry[0] = seq = st.next_seq
        st.next_seq = seq + 1
        table[key] = entry  # as st.insert, inline: this runs for most records
        st.added[seq] = (side, key)
        st.state_bytes += entry[-1]
        if t < st.check_at:
            st.check_at = t
        if len(table) > self.config.max_pending:
            oldest = next(iter(table))
            out.unmatched.append(_unmatched(oldest, side, EVICTED, st.remove(side, oldest)))

    def _match(self, st: PartitionState, key: tuple, weight: int, stack: tuple[tuple, int, tuple], kern: list,
               out: Outcome) -> None:
        """One pair: (node, pid, mappings id, mappings, launch addresses leaf first, weight, kernel start, kernel
        duration, device, stream, kernel name, stack number, the stack's code objects, whether the kernel record
        came from a simulated GPU library)."""
        node, pid, start, _ = key
        proc = st.procs.get((node, pid, start))
        mid, mappings = (proc[3], proc[2]) if proc is not None else (0, [])
        out.matches.append((node, pid, mid, mappings, stack[0], weight, kern[1], kern[2] - kern[1], kern[3], kern[4],
                            kern[5], stack[1], stack[2], kern[6]))

    def _set_mappings(self, st: PartitionState, pkey: tuple, t: int, mappings: list[dict]) -> None:
        old = st.procs.get(pkey)
        if old is not None:
            if old[1] > t:
                return  # an older launch's list: the one held is newer
            st.remove(PROCESS, pkey)
            mid = old[3] if old[2] == mappings else self.mapping_id(mappings)
        else:
            mid = self.mapping_id(mappings)
        st.insert(PROCESS, pkey, [st.next_seq, t, mappings, mid, process_size(pkey[0], mappings)])
        st.next_seq += 1
        due = t + self.config.mappings_ttl_ns - self.config.horizon_ns
        if due < st.check_at:
            st.check_at = due
        if len(st.procs) > self.config.max_processes:
            st.remove(PROCESS, next(iter(st.procs)))

    def stack_no(self, addrs: list[int] | tuple, codes: tuple = ()) -> tuple[tuple, int, tuple]:
        """The addresses as a shared tuple, a number for them with the code objects their Python frames name (equal
        stacks, equal numbers, never reused), and those code objects: launch stacks repeat, so they are hashed once
        here and keyed by number downstream."""
        key = (tuple(addrs), codes)
        hit = self._stacks.get(key)
        if hit is None:
            if len(self._stacks) > 500_000:
                self._stacks.clear()
            hit = self._stacks[key] = (key[0], self._next_stack, codes)
            self._next_stack += 1
        return hit

    def mapping_id(self, mappings: list[dict]) -> int:
        """A number for this list of mappings (equal lists, equal numbers), for caches of symbolized stacks."""
        content = tuple((m["start"], m["limit"], m["file_offset"], m["path"], m["build_id"]) for m in mappings)
        mid = self._mapping_ids.get(content)
        if mid is None:
            if len(self._mapping_ids) > 100_000:
                self._mapping_ids.clear()
            mid = self._mapping_ids[content] = self._next_mapping_id
            self._next_mapping_id += 1
        return mid

    def _expire(self, st: PartitionState, out: Outcome) -> None:
        """Count out what waited past the cutoff, from the oldest arrival on, and drop stale mappings."""
        cutoff = st.cutoff(self.config.horizon_ns)
        next_check = FOREVER
        for side, table in ((LAUNCH, st.launches), (KERNEL, st.kernels)):
            while table:
                key = next(iter(table))
                entry = table[key]
                if entry[1] >= cutoff:
                    next_check = min(next_check, entry[1])
                    break
                out.unmatched.append(_unmatched(key, side, EXPIRED, st.remove(side, key)))
        ttl_cutoff = cutoff + self.config.horizon_ns - self.config.mappings_ttl_ns
        while st.procs:
            pkey = next(iter(st.procs))
            t = st.procs[pkey][1]
            if t >= ttl_cutoff:
                next_check = min(next_check, t + self.config.mappings_ttl_ns - self.config.horizon_ns)
                break
            st.remove(PROCESS, pkey)
        st.check_at = next_check


def _unmatched(key: tuple, side: int, reason: str, entry: list) -> tuple:
    node, pid = key[0], key[1]
    if side == LAUNCH:
        return node, pid, entry[1], LAUNCH, reason, 0, entry[2]
    return node, pid, entry[1], KERNEL, reason, entry[2] - entry[1], 0
