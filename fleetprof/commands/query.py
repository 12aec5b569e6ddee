"""`fleetprof query top|flamegraph`: the named profile queries over a time range, in the usual output formats."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fleetprof.collectives import COLLECTIVE_CHOICES, nccl_label
from fleetprof.commands.query_metrics import metrics
from fleetprof.commands.query_notes import simulated_note, why_empty
from fleetprof.commands.sql import emit
from fleetprof.commands.time_range import time_range
from fleetprof.commands.workload_options import workload_options
from fleetprof.flamegraph_formats import BINARY_FORMATS, FORMATS
from fleetprof.gpu_filters import WHAT_CHOICES
from fleetprof.profile_kinds import KINDS, export_profile
from fleetprof.query_client import QueryError, QueryTarget, query_target
from fleetprof.settings import Settings
from fleetprof.table_format import duration_ns, print_table, say_no_rows
from schemas.wire import GPU_BINARY

COLLECTIVES_WHAT = {"hide": "GPU kernel time outside NCCL collectives", "only": "GPU kernel time in NCCL collectives"}
GPU_WHAT = {"kernels": "GPU kernel time", "copies": "GPU time in memory copies and sets"}


def _filters(node: str | None, pid: int | None, comm: str | None, kind: str = "cpu", collectives: str = "all",
             what: str = "all", nvtx_range: str | None = None) -> dict[str, Any]:
    # '' and 0 mean "no filter" to the named queries; only the GPU ones know collectives, copies and NVTX ranges
    if kind != "gpu":
        for given, option in ((collectives != "all", "--collectives picks NCCL kernels"),
                              (what != "all", "--what picks kernels or copies"),
                              (nvtx_range is not None, "--nvtx-range picks GPU time by NVTX range")):
            if given:
                raise click.UsageError(f"{option}: it goes with --kind gpu")
    found: dict[str, Any] = {"node": node or "", "pid": pid or 0, "comm": comm or ""}
    if kind != "gpu":
        return found
    return {**found, "collectives": collectives, "what": what, "nvtx_range": nvtx_range or ""}


def _what(kind: str, filters: dict[str, Any]) -> str | None:
    """What an empty answer found none of, where --collectives, --what or --nvtx-range narrowed it (why_empty's
    `what`)."""
    if kind != "gpu":
        return None
    what = COLLECTIVES_WHAT.get(filters["collectives"]) or GPU_WHAT.get(filters["what"])
    if filters["nvtx_range"]:
        return f"{what or 'GPU time'} under NVTX range {filters['nvtx_range']!r}"
    return what


def _run(settings: Settings, work: Any) -> Any:
    try:
        with query_target(settings) as target:
            return work(target)
    except QueryError as exc:
        raise click.ClickException(str(exc)) from None


def range_options(func: Any) -> Any:
    """--kind, --since, --until, --node, --pid, --comm, --collectives, --what, --nvtx-range and the workload filters
    (--namespace, --pod, --job, --container, passed as `workload`): shared by every profile query."""
    for option in reversed([
        click.option("--kind", type=click.Choice(list(KINDS)), default="cpu", show_default=True,
                     help="cpu: CPU samples by stack; gpu: GPU kernel time (ns) by the CPU stack that launched each "
                          "kernel, with the kernel as the leaf."),
        click.option("--since", default="1h", show_default=True,
                     help="Start: 5m, 2h, 7d (before --until), epoch seconds or ISO-8601 (no zone = UTC)."),
        click.option("--until", default="now", show_default=True, help="End (exclusive), same forms as --since."),
        click.option("--node", default=None, help="Only this node."),
        click.option("--pid", type=click.IntRange(min=1), default=None, help="Only this process id."),
        click.option("--comm", default=None, help="Only processes with this command name."),
        click.option("--collectives", type=click.Choice(COLLECTIVE_CHOICES), default="all", show_default=True,
                     help="gpu: NCCL collective kernels (ncclDevKernel_*, ncclKernel_*) shown as the others (all), "
                          "left out (hide), or alone (only); shares are of what is shown."),
        click.option("--what", type=click.Choice(WHAT_CHOICES), default="all", show_default=True,
                     help="gpu: kernels, memory copies and sets ('[memcpy HtoD]', '[memset]' leaves: copies), or "
                          "both (all); shares are of what is shown."),
        click.option("--nvtx-range", default=None, metavar="RANGE",
                     help="gpu: only the GPU time launched under a matching NVTX range: RANGE without ' > ' matches "
                          "a range path holding that range ('forward' matches 'step > forward > attn'); with ' > ', "
                          "a path starting with those ranges ('step > forward'). Whole names, exactly."),
    ]):
        func = option(func)
    return workload_options(func)


@click.group()
def query() -> None:
    """Profile queries over a time range (through the owning process's API, or the store directly)."""


query.add_command(metrics)


@query.command()
@range_options
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="How many functions.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.pass_obj
def top(settings: Settings, kind: str, since: str, until: str, node: str | None, pid: int | None,
        comm: str | None, collectives: str, what: str, nvtx_range: str | None, limit: int, fmt: str,
        workload: dict[str, str]) -> None:
    """Top functions by self samples (gpu: kernels and launching functions by self GPU time), with total
    (inclusive) samples or time and the share of all in the range.

    The table shows GPU time as durations and shares as percentages; JSON and CSV keep samples or ns and a 0..1
    share. An NCCL kernel reads as its collective and type, then the kernel (`[nccl AllReduce float32]
    ncclDevKernel_AllReduce_Sum_f32_RING_LL`); gpu JSON and CSV keep each kernel's full name (demangled) in `kernel`
    ('' for a launching function). A line on stderr says when the rows come from a simulated source, and why an
    empty result is empty."""
    start, end = time_range(since, until)
    filters = {**_filters(node, pid, comm, kind, collectives, what, nvtx_range), **workload}
    params = {"since": start, "until": end, **filters}
    queries = KINDS[kind]

    def work(target: QueryTarget) -> tuple[list[str], list[list[Any]], list[list[Any]], str | None, str | None]:
        columns, rows = target.named(queries.top, {**params, "limit": limit})
        _, totals = target.named(queries.totals, params)
        if not rows:
            return columns, rows, totals, why_empty(target, kind, start, end, filters, _what(kind, filters)), None
        return columns, rows, totals, None, simulated_note(target, kind, start, end, node)

    columns, rows, totals, empty, simulated = _run(settings, work)
    all_samples = sum(int(r[1]) for r in totals)
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    for rec in records:
        rec["share"] = rec["self"] / all_samples if all_samples else 0.0
        if kind == "gpu":
            rec["kernel"] = rec["function"] if rec["binary"] == GPU_BINARY else ""
            rec["function"] = nccl_label(rec["kernel"]) if rec["kernel"] else rec["function"]
    if fmt == "table":
        value = duration_ns if kind == "gpu" else str
        cells = [[r["function"], r["binary"], value(r["self"]), _pct(r["self"], all_samples), value(r["total"]),
                  _pct(r["total"], all_samples)] for r in records]
        print_table(["function", "binary", "self", "self %", "total", "total %"], cells, [False, False] + [True] * 4)
        span = f"from {start.isoformat(timespec='seconds')} to {end.isoformat(timespec='seconds')}"
        if not rows:
            say_no_rows(empty)
        elif kind == "gpu":
            click.echo(f"{duration_ns(all_samples)} of GPU time {span}", err=True)
        else:
            click.echo(f"{all_samples} samples {span}", err=True)
    else:
        out_columns = ["function", "binary", "self", "total", "share", *(["kernel"] if kind == "gpu" else [])]
        emit(out_columns, [[r[c] for c in out_columns] for r in records], fmt, empty)
    if simulated:
        click.echo(simulated, err=True)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def say_if_empty(settings: Settings, kind: str, start: datetime, end: datetime, filters: dict[str, Any],
                 found: int, what: str | None = None) -> None:
    """For a command that found nothing (`found` == 0): "0 rows: …" on stderr, naming the values of the filters
    that name nothing in the range, else that there is no `what` (why_empty's; `fleetprof query flamegraph` calls it
    last, with the stacks it wrote)."""
    if not found:
        say_no_rows(_run(settings, lambda target: why_empty(target, kind, start, end, filters, what)))


@query.command()
@range_options
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default="folded", show_default=True,
              help="folded: 'root;...;leaf count' lines (flamegraph.pl, inferno); json: stacks with counts; "
                   "speedscope: speedscope.app JSON; pprof: gzip'd profile.proto (go tool pprof, Parca, Pyroscope); "
                   "html: a self-contained flame graph page.")
@click.option("--merge-processes", is_flag=True,
              help="Add all processes' stacks together: no per-process root frames (pprof: no node, pid and comm "
                   "labels).")
@click.option("--nvtx-level", is_flag=True,
              help="gpu: the launches' NVTX range path as frames ('[nvtx] step', '[nvtx] forward') between the "
                   "process (or, with --merge-processes, the root) and the launching stack: time per range.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write to this file instead of stdout.")
@click.pass_obj
def flamegraph(settings: Settings, kind: str, since: str, until: str, node: str | None, pid: int | None,
               comm: str | None, collectives: str, what: str, nvtx_range: str | None, fmt: str,
               merge_processes: bool, nvtx_level: bool, output: Path | None, workload: dict[str, str]) -> None:
    """Stacks over the range, root first, with their CPU sample counts (gpu: the launching CPU stack with the
    kernel as the leaf, and its GPU time in ns), in a flame graph format.

    \b
    Each process's stacks hang under a root frame of their own, as in py-spy's and Parca's whole-machine flame
    graphs: `python3 (pid 1234)`, with the node (`python3 (pid 1234 on gpu-7)`) unless --node picks one;
    --merge-processes adds the processes together instead. pprof never has that frame: each sample carries the
    string labels node, pid and comm, which pprof tools group and filter by (go tool pprof -tags, -tagfocus
    comm=python3, -tagfocus 'pid=^1234$'); it has the period (cpu: the nanoseconds between two samples at the
    agent's frequency, and a cpu value next to the sample count), one mapping per binary and Python frames' files
    and lines. When the kind's data came from a simulated source, pprof's comments, speedscope's profile name and
    the HTML page say so (folded and JSON have no place for it). An NCCL kernel leaf reads as its collective and
    type, then the kernel: `[nccl AllReduce float32] ncclDevKernel_AllReduce_Sum_f32_RING_LL`."""
    out = sys.stdout.buffer
    if output is None and fmt in BINARY_FORMATS and out.isatty():
        raise click.ClickException(f"{fmt} output is binary: write it to a file with -o FILE (or redirect stdout)")
    start, end = time_range(since, until)
    filters = {**_filters(node, pid, comm, kind, collectives, what, nvtx_range), **workload}
    if nvtx_level and kind != "gpu":
        raise click.UsageError("--nvtx-level shows NVTX ranges of GPU time: it goes with --kind gpu")
    flame_filters = {**filters, "nvtx_level": int(nvtx_level)} if kind == "gpu" else filters
    export = _run(settings, lambda target: export_profile(lambda name, params: target.named(name, params)[1], kind,
                                                          fmt, start, end, flame_filters, merge_processes))
    if output is None:
        out.write(export.data)
        out.flush()
    else:
        output.write_bytes(export.data)
        click.echo(f"wrote {export.stacks} stacks to {output}", err=True)
    say_if_empty(settings, kind, start, end, filters, export.stacks, _what(kind, filters))
