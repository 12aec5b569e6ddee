"""`fleetprof query metrics`: NVML readings over a time range, per GPU (or per process with --processes)."""

from __future__ import annotations

import click

from fleetprof.commands.sql import emit
from fleetprof.commands.time_range import time_range
from fleetprof.query_client import QueryError, query_target
from fleetprof.settings import Settings
from processors.sink import DEVICE_COLUMNS, PROCESS_COLUMNS

QUERIES = {False: "gpu_metrics", True: "gpu_process_metrics"}
# The named queries return the tables' columns as the sink stores them; an empty result carries no column names,
# and CSV and table output still want their header.
COLUMNS = {False: DEVICE_COLUMNS, True: PROCESS_COLUMNS}


@click.command("metrics")
@click.option("--since", default="1h", show_default=True,
              help="Start: 5m, 2h, 7d (before --until), epoch seconds or ISO-8601 (no zone = UTC).")
@click.option("--until", default="now", show_default=True, help="End (exclusive), same forms as --since.")
@click.option("--node", default=None, help="Only this node.")
@click.option("--gpu", type=click.IntRange(min=0, max=65535), default=None,
              help="Only this GPU index (with its MIG devices).")
@click.option("--processes", is_flag=True, help="Per-process rows (SM/memory utilization, used memory) instead.")
@click.option("--limit", type=click.IntRange(min=1, max=2**32 - 1), default=100_000, show_default=True,
              help="At most this many rows.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.pass_obj
def metrics(settings: Settings, since: str, until: str, node: str | None, gpu: int | None, processes: bool,
            limit: int, fmt: str) -> None:
    """GPU metrics from NVML over the range, oldest first per node: one row per device and poll.

    Empty cells (null in JSON) are readings NVML could not give on that device. Goes through the API of the process
    that owns the store if one answers, else opens the store itself.
    """
    start, end = time_range(since, until)
    # '' and -1 mean "no filter" to the named queries
    params = {"since": start, "until": end, "node": node or "", "gpu": -1 if gpu is None else gpu, "limit": limit}
    try:
        with query_target(settings) as target:
            columns, rows = target.named(QUERIES[processes], params)
    except QueryError as exc:
        raise click.ClickException(str(exc)) from None
    if not rows:
        columns = columns or list(COLUMNS[processes])
        click.echo(f"no GPU metrics from {start.isoformat()} to {end.isoformat()}", err=True)
    emit(columns, rows, fmt)
    if len(rows) == limit:
        click.echo(f"stopped at {limit} rows: narrow the range or raise --limit", err=True)
