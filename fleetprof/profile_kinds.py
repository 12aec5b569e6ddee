"""The two kinds of profile (CPU samples, GPU kernel time): their named queries, units, and the export of a range as a
flame graph file, shared by `fleetprof query flamegraph` and the web UI's /api/export so both give the same bytes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetprof.collectives import nccl_label
from fleetprof.flamegraph_formats import FORMATS, html_page, speedscope
from fleetprof.pprof import Sample, pprof_bytes
from fleetprof.simulated_sources import simulated_line

# The agent's sampling frequency when it is not stored (data from before profile_windows kept it, migration 0012):
# producers/collectors.py CollectorOptions.frequency_hz's default
AGENT_DEFAULT_HZ = 19


@dataclass(frozen=True)
class Kind:
    """What a profile counts, and the named queries that rank it, total it and fold it into stacks."""

    top: str
    totals: str
    flamegraph: str  # root-first function names and their value, the processes added up
    processes: str  # per process (node, pid, comm): function names, binaries (cpu: and the frequency) and value
    unit: str  # what one unit of a value is, for people
    pprof_type: tuple[str, str]  # pprof sample type and unit


KINDS = {
    "cpu": Kind("top_functions_cpu", "totals_cpu", "flamegraph_cpu", "flamegraph_processes_cpu", "samples",
                ("samples", "count")),
    # GPU time in ns, by the CPU stack that launched each kernel, the kernel as the leaf frame
    "gpu": Kind("top_kernels_gpu", "totals_gpu", "flamegraph_gpu", "flamegraph_processes_gpu", "ns",
                ("gpu_time", "nanoseconds")),
}

Rows = Callable[[str, dict[str, Any]], Sequence[Sequence[Any]]]  # a named query's rows: (name, params) -> rows


@dataclass(frozen=True)
class Export:
    data: bytes
    stacks: int  # how many stacks (pprof: samples) the file holds


def process_frame(comm: str, pid: int, node: str | None) -> str:
    """The frame that roots a process's stacks: `python3 (pid 1234)`; with the node when the export has several
    (`python3 (pid 1234 on gpu-7)`); `pid 1234` for a process without a command name."""
    where = f"pid {pid}" if node is None else f"pid {pid} on {node}"
    return f"{comm} ({where})" if comm else where


def export_profile(rows: Rows, kind_name: str, fmt: str, since: datetime, until: datetime, filters: dict[str, Any],
                   merge_processes: bool = False) -> Export:
    """The range as a flame graph file in `fmt`, as `fleetprof query flamegraph` writes it.

    Stacks are rooted per process (process_frame) unless merge_processes; pprof keeps the process in the samples'
    labels (node, pid, comm) instead, dropped when merge_processes. A kind whose data came from a simulated source
    says so in pprof's comments, speedscope's profile name and the HTML page's title and banner (folded and JSON
    have no place for it). GPU stacks' NCCL kernels read as labelled_kernels labels them."""
    kind = KINDS[kind_name]
    params = {"since": since, "until": until, **filters}
    if kind_name == "gpu":
        rows = labelled_kernels(rows, kind)
    simulated = [str(node) for k, node in rows("simulated_sources", {"since": since, "until": until,
                                                                      "node": filters.get("node", "")})
                 if k == kind_name]
    note = simulated_line(kind_name, simulated) if simulated else ""
    if fmt == "pprof":
        process_rows = rows(kind.processes, params)
        binaries = sorted({b for r in process_rows for b in r[4] if b})
        build_ids = {str(b): str(i) for b, i in rows("binary_build_ids", {"binaries": binaries})} if binaries else {}
        return _pprof(process_rows, kind_name, since, until, note, merge_processes, build_ids)
    if merge_processes:
        stacks = [(list(functions), int(count)) for functions, count in rows(kind.flamegraph, params)]
    else:
        stacks = split_stacks(rows(kind.processes, params), one_node=bool(filters.get("node")))
    title = f"fleetprof {kind_name} {since.isoformat(timespec='seconds')} – {until.isoformat(timespec='seconds')}"
    return Export(render_profile(fmt, stacks, title, kind, note), len(stacks))


def labelled_kernels(rows: Rows, kind: Kind) -> Rows:
    """`rows` with the kernel that ends each stack of the kind's flame graph queries named as nccl_label names it
    (`[nccl AllReduce float32] ncclDevKernel_AllReduce_Sum_f32_RING_LL`), every other name as it is. The label keeps
    the kernel's own name, so different kernels stay apart."""
    functions_at = {kind.flamegraph: 0, kind.processes: 3}

    def labelled(name: str, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        found = rows(name, params)
        at = functions_at.get(name)
        if at is None:
            return found
        return [(*row[:at], [*row[at][:-1], nccl_label(row[at][-1])] if len(row[at]) else row[at], *row[at + 1:])
                for row in found]

    return labelled


def split_stacks(process_rows: Sequence[Sequence[Any]], one_node: bool) -> list[tuple[list[str], int]]:
    """A processes query's rows as stacks rooted at their process's frame: summed over binaries, the biggest first
    (then by name, as the flame graph queries order)."""
    sums: Counter[tuple[str, ...]] = Counter()
    for node, pid, comm, functions, _binaries, *_, count in process_rows:
        sums[(process_frame(comm, int(pid), None if one_node else node), *functions)] += int(count)
    return [(list(stack), n) for stack, n in sorted(sums.items(), key=lambda item: (-item[1], item[0]))]


def render_profile(fmt: str, stacks: list[tuple[list[str], int]], title: str, kind: Kind, note: str = "") -> bytes:
    """A flame graph file other than pprof; values in the kind's unit where the format can say so."""
    if fmt == "html":
        return html_page(stacks, title, banner=note)
    if fmt != "speedscope":
        return FORMATS[fmt](stacks, title=title)
    doc = json.loads(speedscope(stacks, f"{title} ({note})" if note else title))
    if kind.unit == "ns":
        for profile in doc["profiles"]:
            profile["unit"] = "nanoseconds"  # speedscope then shows the weights as durations
    return json.dumps(doc).encode()


def _pprof(process_rows: Sequence[Sequence[Any]], kind_name: str, since: datetime, until: datetime, note: str,
           merge_processes: bool, build_ids: dict[str, str]) -> Export:
    """pprof with context: period, one mapping per binary with its build id, labels node / pid / comm (unless
    merge_processes)."""
    cpu = kind_name == "cpu"
    # cpu: a sample count and its CPU time, as Go's CPU profiles have them; gpu: GPU time
    sample_types = [("samples", "count"), ("cpu", "nanoseconds")] if cpu else [("gpu_time", "nanoseconds")]
    period, periods, said = _cpu_periods(process_rows) if cpu else (1, {}, [])
    comments = [note, *said] if note else said
    samples: dict[tuple, list[int]] = {}
    for node, pid, comm, functions, binaries, *_, count in process_rows:
        labels = () if merge_processes else tuple((k, v) for k, v in (("node", node), ("pid", str(pid)),
                                                                        ("comm", comm)) if v)
        values = [int(count), int(count) * periods[node]] if cpu else [int(count)]
        key = (tuple(functions), tuple(binaries), labels)
        got = samples.setdefault(key, [0] * len(values))
        for i, v in enumerate(values):
            got[i] += v
    data = pprof_bytes([Sample(functions, values, binaries, [build_ids.get(b, "") for b in binaries], labels=labels)
                        for (functions, binaries, labels), values in samples.items()],
                       sample_types=sample_types, period_type=sample_types[-1], period=period,
                       default_sample_type=sample_types[-1][0],
                       comments=comments, time_nanos=_ns(since), duration_nanos=_ns(until) - _ns(since))
    return Export(data, len(samples))


def _cpu_periods(process_rows: Sequence[Sequence[Any]]) -> tuple[int, dict[str, int], list[str]]:
    """The profile's period (ns between two samples), each node's, and comments saying where they came from: each
    node's agent frequency where it was stored, else the agent's default (said in a comment). The profile's period is
    the one most samples were taken at."""
    stored = {node: int(frequency_hz) for node, *_, frequency_hz, _count in process_rows}
    hz = {node: f or AGENT_DEFAULT_HZ for node, f in stored.items()}
    weight: Counter[int] = Counter()
    for node, *_, count in process_rows:
        weight[hz[node]] += int(count)
    said = []
    unknown = sorted(node for node, f in stored.items() if not f)
    if unknown:
        said.append(f"sampling frequency not stored for node{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                    f"cpu time assumes the agent's default {AGENT_DEFAULT_HZ} Hz")
    if len(set(hz.values())) > 1:
        said.append("nodes sampled at different frequencies: " +
                    ", ".join(f"{node} {f} Hz" for node, f in sorted(hz.items())) + "; cpu time uses each node's")
    main = max(weight, key=lambda f: (weight[f], f)) if weight else AGENT_DEFAULT_HZ
    return 1_000_000_000 // main, {node: 1_000_000_000 // f for node, f in hz.items()}, said


def _ns(t: datetime) -> int:
    return round(t.timestamp() * 1000) * 1_000_000  # the store's times are whole milliseconds at most
