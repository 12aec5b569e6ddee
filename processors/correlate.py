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
- A CUDA graph launch (GpuLaunch.graph) is matched by every kernel, copy and set its graph replays (all carry its
  correlation id): it stays pending after its first match, with a count of its matches, until the cutoff passes its
  time, and then leaves without an unmatched count if it matched at least once (EXPIRED if never). Records of a graph
  (graph_id != 0) that come before their launch wait under a key of their own (graph node and start time added), so
  many wait per correlation id, and an index by correlation key lets the launch match them all when it comes
  (processors/correlate_graphs.py). Other launches pair with one record, as above.
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

from dataclasses import dataclass

from processors.correlate_graphs import graph_launch, wait_graph_record
from processors.correlate_state import (
    EVICTED,
    EXPIRED,
    FOREVER,
    KERNEL,
    LATE,
    LAUNCH,
    MAX_BYTES,
    MAX_DURATION_NS,
    MAX_KERNEL_NAME,
    MAX_KINDS,
    MAX_MAPPINGS,
    MAX_MAPPINGS_BYTES,
    MAX_NODE,
    MAX_NVTX_RANGE,
    MAX_USER_ADDRS,
    MAX_WEIGHT,
    NEVER,
    PROCESS,
    SECOND_NS,
    SIDES,
    STACK,
    SUPERSEDED,
    Outcome,
    PartitionState,
    count_left,
    invalid_kernel,
    invalid_launch,
    kernel_size,
    launch_codes,
    launch_size,
    process_size,
    stack_size,
)


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
    # a partition is shared by many nodes: one node's clock far ahead must not move its event time, or every other
    # node's records there would fall behind the horizon at once (late) and their mappings expire. Well under the
    # horizon, so records on time stay on time; clocks of a synchronized fleet differ by far less.
    max_ahead_ns: int = 10 * SECOND_NS  # how far past the processor's clock a record may move event time

    def __post_init__(self) -> None:
        for name in ("horizon_ns", "window_ns", "max_pending", "max_processes", "mappings_ttl_ns", "log_slots",
                     "snapshot_min_bytes", "chunk_bytes", "max_ahead_ns"):
            if getattr(self, name) < 1:
                raise ValueError(f"correlate setting {name} must be >= 1, got {getattr(self, name)}")
        if self.log_slots < 4:
            raise ValueError(f"correlate setting log_slots must be >= 4, got {self.log_slots}")



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
        self.ceiling_ns = 1 << 63  # the latest event time records may bring: `set_clock`; none until it is called

    def set_clock(self, now_ns: int) -> None:
        """The processor's clock for the next records (an input, so the join stays a function of what it is given):
        event time moves at most config.max_ahead_ns past it; records stamped later still match."""
        self.ceiling_ns = now_ns + self.config.max_ahead_ns

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
        if side == LAUNCH:
            reason = invalid_launch(record)
            if reason is None:
                self._launch(st, record, out)
        else:
            reason = invalid_kernel(record)
            if reason is None:
                self._kernel(st, record, out)
        if reason is not None:
            out.invalid.append((index, reason))
            return
        a, b = st.wm  # min(st.wm), without the call: this runs for every record
        if (a if a < b else b) - self.config.horizon_ns > st.check_at:
            self._expire(st, out)

    def _launch(self, st: PartitionState, rec: dict, out: Outcome) -> None:
        cfg = self.config
        node, pid, start, t = rec["node"], rec["pid"], rec["process_start_ns"], rec["time_ns"]
        if rec["mappings"]:
            self._set_mappings(st, (node, pid, start), t, rec["mappings"])
        key = (node, pid, start, rec["correlation_id"])
        if t > st.wm[LAUNCH]:
            if t <= self.ceiling_ns:
                st.wm[LAUNCH] = t
            else:
                out.ahead_of_clock += 1
                st.wm[LAUNCH] = max(st.wm[LAUNCH], self.ceiling_ns)
        try:  # subscripts, not .get, on this path of every launch: decoded records have every field
            nvtx, graph = rec["nvtx_range"], rec["graph"]
        except KeyError:  # a record built without GpuLaunch v3's fields
            nvtx, graph = rec.get("nvtx_range", ""), rec.get("graph", False)
        if graph:
            graph_launch(self, st, key, rec, nvtx, out)
            return
        kern = st.kernels.get(key)
        if kern is not None:
            ks = kern[1]
            if start or t - cfg.skew_ns <= ks <= t + cfg.horizon_ns:
                st.remove(KERNEL, key)
                self._match(st, key, rec["weight"], self.stack_no(rec["user_addrs"], launch_codes(rec)), nvtx, kern,
                            out, rec.get("identity_id", 0))
                return
            if ks > t:  # the kernel belongs to a later process with this pid: this launch is the stale one
                out.unmatched.append((node, pid, t, LAUNCH, SUPERSEDED, 0, rec["weight"]))
                return
            st.remove(KERNEL, key)
            out.unmatched.append((node, pid, ks, KERNEL, SUPERSEDED, kern[2] - ks, 0))
        addrs, no, codes = self.stack_no(rec["user_addrs"], launch_codes(rec))
        self._wait(st, LAUNCH, key, [0, t, rec["weight"], addrs, no, codes, nvtx, False, 0, rec.get("identity_id", 0),
                                     82 + len(node) + len(nvtx)], out)  # launch_size, inline

    def _kernel(self, st: PartitionState, rec: dict, out: Outcome) -> None:
        cfg = self.config
        node, pid, start, s = rec["node"], rec["pid"], rec["process_start_ns"], rec["start_ns"]
        key = (node, pid, start, rec["correlation_id"])
        if s > st.wm[KERNEL]:
            if s <= self.ceiling_ns:
                st.wm[KERNEL] = s
            else:
                out.ahead_of_clock += 1
                st.wm[KERNEL] = max(st.wm[KERNEL], self.ceiling_ns)
        name = rec["kernel_name"]
        try:  # as in _launch
            gid, activity = rec["graph_id"], rec["activity"]
        except KeyError:  # a record built without GpuKernel v2's fields
            gid, activity = rec.get("graph_id", 0), rec.get("activity", "KERNEL")
        if activity == "KERNEL":
            kern = [0, s, rec["end_ns"], rec["device_id"], rec["stream_id"] & 0xFFFFFFFF, name,
                    bool(rec.get("simulated", False)), "KERNEL", 0, "", "", gid,
                    rec.get("graph_node_id", 0) if gid else 0, 112 + len(node) + len(name)]  # kernel_size, inline
        else:
            ck, mk = rec.get("copy_kind", ""), rec.get("memory_kinds", "")
            kern = [0, s, rec["end_ns"], rec["device_id"], rec["stream_id"] & 0xFFFFFFFF, name,
                    bool(rec.get("simulated", False)), activity, rec.get("bytes", 0), ck, mk, gid,
                    rec.get("graph_node_id", 0), kernel_size(node, name, ck + mk)]
        launch = st.launches.get(key)
        if launch is not None:
            lt = launch[1]
            if start or lt - cfg.skew_ns <= s <= lt + cfg.horizon_ns:
                if launch[7]:  # a graph launch: it waits on for the rest of its graph's records
                    out.graph_launches += int(launch[8] == 0)  # joined with its first record
                    launch[8] += 1
                    if launch[0] not in st.added:
                        st.updated[launch[0]] = key
                else:
                    st.remove(LAUNCH, key)
                self._match(st, key, launch[2], (launch[3], launch[4], launch[5]), launch[6], kern, out, launch[9])
                return
            if lt > s:  # the launch belongs to a later process with this pid: this kernel is the stale one
                out.unmatched.append((node, pid, s, KERNEL, SUPERSEDED, rec["end_ns"] - s, 0))
                return
            count_left(out, key, LAUNCH, SUPERSEDED, st.remove(LAUNCH, key))
        if gid:
            wait_graph_record(self, st, key, kern, out)
            return
        self._wait(st, KERNEL, key, kern, out)

    def _wait(self, st: PartitionState, side: int, key: tuple, entry: list, out: Outcome) -> None:
        """Make a record wait for its partner (or count it late, or settle a duplicate key), then keep bounds."""
        t = entry[1]
        if t < min(st.wm) - self.config.horizon_ns:
            count_left(out, key, side, LATE, entry)
            return
        table = st.tables[side]
        old = table.get(key)
        if old is not None:
            if old[1] > t:  # the waiting one is newer: keep it
                count_left(out, key, side, SUPERSEDED, entry)
                return
            count_left(out, key, side, SUPERSEDED, st.remove(side, key))
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
            count_left(out, oldest, side, EVICTED, st.remove(side, oldest))

    def _match(self, st: PartitionState, key: tuple, weight: int, stack: tuple[tuple, int, tuple], nvtx: str,
               kern: list, out: Outcome, identity: int = 0) -> None:
        """One pair: (node, pid, mappings id, mappings, launch addresses leaf first, weight, kernel start, kernel
        duration, device, stream, kernel name (a copy's or set's label), stack number, the stack's code objects,
        whether the kernel record came from a simulated GPU library, the launch's NVTX range, activity, bytes,
        memory kinds, graph id, graph node id, correlation id, the launching process's identity id)."""
        node, pid, start, corr = key
        proc = st.procs.get((node, pid, start))
        mid, mappings = (proc[3], proc[2]) if proc is not None else (0, [])
        out.matches.append((node, pid, mid, mappings, stack[0], weight, kern[1], kern[2] - kern[1], kern[3], kern[4],
                            kern[5], stack[1], stack[2], kern[6], nvtx, kern[7], kern[8], kern[10], kern[11],
                            kern[12], corr, identity))

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
                count_left(out, key, side, EXPIRED, st.remove(side, key))
        ttl_cutoff = cutoff + self.config.horizon_ns - self.config.mappings_ttl_ns
        while st.procs:
            pkey = next(iter(st.procs))
            t = st.procs[pkey][1]
            if t >= ttl_cutoff:
                next_check = min(next_check, t + self.config.mappings_ttl_ns - self.config.horizon_ns)
                break
            st.remove(PROCESS, pkey)
        st.check_at = next_check


__all__ = ["CorrelateConfig", "Correlator", "EVICTED", "EXPIRED", "FOREVER", "KERNEL", "LATE", "LAUNCH", "MAX_BYTES",
           "MAX_DURATION_NS", "MAX_KERNEL_NAME", "MAX_KINDS", "MAX_MAPPINGS", "MAX_MAPPINGS_BYTES", "MAX_NODE",
           "MAX_NVTX_RANGE", "MAX_USER_ADDRS", "MAX_WEIGHT", "NEVER", "Outcome", "PROCESS", "PartitionState",
           "SECOND_NS", "SIDES", "STACK", "SUPERSEDED", "count_left", "invalid_kernel", "invalid_launch",
           "kernel_size", "launch_codes", "launch_size", "process_size", "stack_size"]
