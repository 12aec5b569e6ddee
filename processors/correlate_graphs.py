"""CUDA graph launches in the correlator's join (processors/correlate.py). Pure.

A graph launch (GpuLaunch.graph) is one sampled launch matched by many activity records: every kernel, copy and set
its graph replays carries the launch's correlation id. So:
- records of a graph (graph_id != 0) that come before their launch wait under a key of their own, (node, pid,
  process start, correlation id, graph node id, start): many wait per correlation id, and only an exact duplicate
  (same node of the graph, same start) supersedes one. `PartitionState.graph_index` lists them by correlation key;
- when the graph launch comes it matches every record waiting with its correlation id (its plain key too, for a
  record that did not say its graph) and then waits itself, holding only a count of its matches, however many
  records come: each later record matches it at once and leaves no state behind;
- it is counted in Outcome.graph_launches when its first record matches it, and leaves once the cutoff passes its
  time (EXPIRED as any launch if it never matched, silently if it did: it left matched), when evicted or superseded
  likewise, and a record of its graph that comes after it left waits, then leaves LATE or EXPIRED as any record.
A launch that is not a graph launch pairs with one record as before, whatever the record's graph_id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processors.correlate_state import (
    KERNEL,
    LAUNCH,
    SUPERSEDED,
    Outcome,
    PartitionState,
    count_left,
    launch_codes,
    launch_size,
)

if TYPE_CHECKING:
    from processors.correlate import Correlator


def graph_key(key: tuple, kern: list) -> tuple:
    """The waiting key of a graph's record: its correlation key, graph node id and start."""
    return key + (kern[12], kern[1])


def index_record(st: PartitionState, key: tuple) -> None:
    """List a waiting graph record (by its graph key) under its correlation key."""
    ckey = key[:4]
    keys = st.graph_index.get(ckey)
    if keys is None:
        keys = st.graph_index[ckey] = {}
    keys[key] = None


def wait_graph_record(corr: Correlator, st: PartitionState, key: tuple, kern: list, out: Outcome) -> None:
    """A graph's record whose launch has not come (or has left): it waits under its graph key, indexed."""
    gkey = graph_key(key, kern)
    corr._wait(st, KERNEL, gkey, kern, out)
    if st.kernels.get(gkey) is kern:
        index_record(st, gkey)


def graph_launch(corr: Correlator, st: PartitionState, key: tuple, rec: dict, nvtx: str, out: Outcome) -> None:
    """A graph launch: match every record waiting with its correlation id, then wait for the rest."""
    cfg = corr.config
    t, weight, start, identity = rec["time_ns"], rec["weight"], key[2], rec.get("identity_id", 0)
    old = st.launches.get(key)
    if old is not None and old[7] and old[1] >= t:  # a duplicate of a waiting graph launch: that one keeps its count
        out.unmatched.append((key[0], key[1], t, LAUNCH, SUPERSEDED, 0, weight))
        return
    stack = corr.stack_no(rec["user_addrs"], launch_codes(rec))
    waiting = [key] if key in st.kernels else []
    keys = st.graph_index.get(key)
    if keys:
        waiting += list(keys)
    matched, later = 0, False
    for k in waiting:
        kern = st.kernels[k]
        ks = kern[1]
        if start or t - cfg.skew_ns <= ks <= t + cfg.horizon_ns:
            st.remove(KERNEL, k)
            corr._match(st, key, weight, stack, nvtx, kern, out, identity)
            matched += 1
        elif ks > t:
            later = True  # a record of a later process with this pid (process_start_ns 0): it waits on for its own
        else:
            count_left(out, k, KERNEL, SUPERSEDED, st.remove(KERNEL, k))  # of an earlier process with this pid
    if later and not matched:  # as for one record: this launch is the stale one
        out.unmatched.append((key[0], key[1], t, LAUNCH, SUPERSEDED, 0, weight))
        return
    out.graph_launches += int(matched > 0)  # joined with the records that waited for it
    addrs, no, codes = stack
    corr._wait(st, LAUNCH, key, [0, t, weight, addrs, no, codes, nvtx, True, matched, identity,
                                 launch_size(key[0], nvtx)], out)
