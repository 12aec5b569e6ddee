"""`fleetprof query metrics`: NVML readings over a time range, per GPU (or per process with --processes)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import click

from fleetprof.commands.query_notes import simulated_note, why_empty
from fleetprof.commands.sql import emit
from fleetprof.commands.time_range import time_range
from fleetprof.commands.workload_options import workload_options
from fleetprof.query_client import QueryError, QueryTarget, query_target
from fleetprof.settings import Settings
from fleetprof.table_format import GIB, cell, print_table, say_no_rows
from processors.sink_columns import DEVICE_COLUMNS, PROCESS_COLUMNS

QUERIES = {False: "gpu_metrics", True: "gpu_process_metrics"}
# The named queries return the tables' columns as the sink stores them; an empty result carries no column names,
# and CSV and table output still want their header.
COLUMNS = {False: DEVICE_COLUMNS, True: PROCESS_COLUMNS}
# what the table shows without --columns
TABLE_COLUMNS = {
    False: ["ts", "node", "gpu_index", "gpu_util_pct", "mem_util_pct", "mem_used_bytes", "sm_clock_mhz", "power_mw",
            "temperature_c", "pcie_tx_kbps", "pcie_rx_kbps", "xid_errors"],
    True: ["ts", "node", "gpu_index", "pid", "comm", "sm_util_pct", "mem_util_pct", "used_memory_bytes"],
}

Format = Callable[[Any, dict[str, Any]], str]  # a stored value and its whole row -> table text


def _time(value: Any, _row: dict[str, Any]) -> str:
    # stored times come back as UTC ISO-8601; the table shows them to the millisecond, as NVML's polls are
    return datetime.fromisoformat(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if value else ""


def _text(value: Any, _row: dict[str, Any]) -> str:
    return cell(value)


def _number(scale: float = 1, spec: str = "d") -> Format:
    """Stored units to the shown ones: value / scale, formatted by spec; null stays empty (NVML could not say)."""
    if scale == 1:
        return lambda v, _row: "" if v is None else format(v, spec)
    return lambda v, _row: "" if v is None else format(v / scale, spec)


def _gpu(value: Any, row: dict[str, Any]) -> str:
    # a MIG device shares its GPU's index: the start of its uuid tells it apart (as the web UI's series labels do)
    return f"{value} {row['uuid'][:12]}" if row.get("parent_uuid") and row.get("uuid") else cell(value)


# stored column -> (table header with the unit shown, how a cell shows, right-aligned)
DISPLAY: dict[str, tuple[str, Format, bool]] = {
    "ts": ("time (UTC)", _time, False),
    "node": ("node", _text, False),
    "gpu_index": ("gpu", _gpu, False),
    "uuid": ("uuid", _text, False),
    "name": ("name", _text, False),
    "parent_uuid": ("parent uuid", _text, False),
    "pid": ("pid", _number(), True),
    "comm": ("comm", _text, False),
    "container_id": ("container", _text, False),
    "gpu_util_pct": ("GPU util %", _number(), True),
    "sm_util_pct": ("SM util %", _number(), True),
    "mem_util_pct": ("mem util %", _number(), True),
    "mem_used_bytes": ("mem used GiB", _number(GIB, ".1f"), True),
    "mem_total_bytes": ("mem total GiB", _number(GIB, ".1f"), True),
    "used_memory_bytes": ("used GiB", _number(GIB, ".1f"), True),
    "sm_clock_mhz": ("SM MHz", _number(), True),
    "mem_clock_mhz": ("mem MHz", _number(), True),
    "power_mw": ("power W", _number(1000, ".0f"), True),
    "power_limit_mw": ("power limit W", _number(1000, ".0f"), True),
    "temperature_c": ("temp °C", _number(), True),
    # NVML's PCIe throughput is in KiB/s; MB/s here as in the web UI's chart (KiB / 1024)
    "pcie_tx_kbps": ("PCIe tx MB/s", _number(1024, ".1f"), True),
    "pcie_rx_kbps": ("PCIe rx MB/s", _number(1024, ".1f"), True),
    "clock_event_reasons": ("clock events", lambda v, _row: "" if v is None else f"{v:#x}", False),
    "xid_errors": ("XID", lambda v, _row: ", ".join(str(x) for x in v or []), False),
    "simulated": ("simulated", lambda v, _row: "yes" if v else "no", False),
}


def chosen_columns(text: str | None, processes: bool) -> list[str] | None:
    """--columns as stored column names (None: not given); a one-line error naming the known ones otherwise."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = COLUMNS[processes]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        what = f"no column {', '.join(repr(n) for n in unknown)}" if unknown else "no column named"
        raise click.ClickException(f"--columns: {what} (known: {', '.join(known)})")
    return names


def metrics_table(columns: list[str], rows: list[list[Any]], shown: list[str]) -> None:
    """The rows' `shown` columns as a table in the units people read (GiB, W, MHz, °C, MB/s, %)."""
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    headers, formats, right = zip(*(DISPLAY[name] for name in shown), strict=True)
    cells = [[fmt(rec.get(name), rec) for name, fmt in zip(shown, formats, strict=True)] for rec in records]
    print_table(list(headers), cells, list(right), [name == "ts" for name in shown])


@click.command("metrics")
@click.option("--since", default="1h", show_default=True,
              help="Start: 5m, 2h, 7d (before --until), epoch seconds or ISO-8601 (no zone = UTC).")
@click.option("--until", default="now", show_default=True, help="End (exclusive), same forms as --since.")
@click.option("--node", default=None, help="Only this node.")
@click.option("--gpu", type=click.IntRange(min=0, max=65535), default=None,
              help="Only this GPU index (with its MIG devices).")
@click.option("--processes", is_flag=True, help="Per-process rows (SM/memory utilization, used memory) instead.")
@click.option("--columns", "columns_text", default=None, metavar="A,B,C",
              help="Only these stored columns, in this order (the table shows them in its units; CSV and JSON as "
                   "stored). Default: a readable set in the table, all columns in CSV and JSON.")
@click.option("--limit", type=click.IntRange(min=1, max=2**32 - 1), default=100_000, show_default=True,
              help="At most this many rows.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@workload_options
@click.pass_obj
def metrics(settings: Settings, since: str, until: str, node: str | None, gpu: int | None, processes: bool,
            columns_text: str | None, limit: int, fmt: str, workload: dict[str, str]) -> None:
    """GPU metrics from NVML over the range, oldest first per node: one row per device and poll.

    The table shows memory in GiB, power in W, PCIe throughput in MB/s, clocks in MHz, temperatures in °C and
    utilization in %; CSV and JSON keep the stored units (bytes, mW, KiB/s) and the `simulated` column. Empty cells
    (null in JSON) are readings NVML could not give on that device. With a workload filter, a device's readings are
    those while the pod holding it (or, where none is known, a process listed on it) was of that workload. Goes
    through the API of the process that owns the store if one answers, else opens the store itself.
    """
    chosen = chosen_columns(columns_text, processes)
    start, end = time_range(since, until)
    # '' and -1 mean "no filter" to the named queries
    params = {"since": start, "until": end, "node": node or "", "gpu": -1 if gpu is None else gpu, "limit": limit,
              **workload}
    what = "GPU process metrics" if processes else "GPU metrics"

    def work(target: QueryTarget) -> tuple[list[str], list[list[Any]], str | None, str | None]:
        columns, rows = target.named(QUERIES[processes], params)
        if not rows:
            given = {"node": node, "gpu": gpu, **workload}
            return columns, rows, why_empty(target, "nvml", start, end, given, what), None
        if fmt != "table":
            return columns, rows, None, None  # CSV and JSON rows carry their own `simulated` column
        shown = {row[columns.index("node")] for row in rows}
        return columns, rows, None, simulated_note(target, "nvml", start, end, node, shown)

    try:
        with query_target(settings) as target:
            columns, rows, empty, simulated = work(target)
    except QueryError as exc:
        raise click.ClickException(str(exc)) from None
    columns = columns or list(COLUMNS[processes])
    if fmt == "table":
        metrics_table(columns, rows, chosen or TABLE_COLUMNS[processes])
        if not rows:
            say_no_rows(empty)
    else:
        shown = chosen or columns
        picks = [columns.index(name) for name in shown]
        emit(shown, [[row[i] for i in picks] for row in rows], fmt, empty)
    if len(rows) == limit:
        click.echo(f"stopped at {limit} rows: narrow the range or raise --limit", err=True)
    if simulated:
        click.echo(simulated, err=True)
