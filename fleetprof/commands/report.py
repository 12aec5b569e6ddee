"""`fleetprof report cost`: GPU-hours, busy and idle, priced per GPU-hour, as a table, CSV, markdown or HTML."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click
from rich.console import Console

from fleetprof.commands.time_range import time_range
from fleetprof.cost_report import BY_CHOICES, CostReportError, build_report, parse_by, parse_price
from fleetprof.cost_report_html import to_html
from fleetprof.cost_report_render import to_csv, to_markdown, to_text
from fleetprof.query_client import QueryError, query_target
from fleetprof.settings import Settings

FORMATS = ("table", "csv", "md", "html")


@click.group()
def report() -> None:
    """Batch reports over a time range (through the owning process's API, or the store directly)."""


@report.command("cost")
@click.option("--since", default="7d", show_default=True,
              help="Start: 5m, 2h, 7d (before --until), epoch seconds or ISO-8601 (no zone = UTC).")
@click.option("--until", default="now", show_default=True, help="End (exclusive), same forms as --since.")
@click.option("--price-per-gpu-hour", "price_text", metavar="PRICE", default=None,
              help="What one GPU-hour costs (any currency). Required.")
@click.option("--by", "by_text", default="node", show_default=True, metavar="|".join(BY_CHOICES),
              help="Group GPU-hours by node or GPU (NVML device readings), by process or container (NVML's "
                   "per-process readings), by workload: namespace, pod, Slurm or Kubernetes job, team (a GPU's "
                   "hours go to the pod that holds it, else to its processes' workloads, else to 'unattributed'), "
                   "or show GPU time by kernel.")
@click.option("--node", default=None, help="Only this node.")
@click.option("--top", type=click.IntRange(min=1, max=10_000), default=10, show_default=True,
              help="Rows in the top kernels and top launching stacks sections.")
@click.option("--max-gap", "max_gap_s", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds one NVML reading may stand for at most (a node that stops reporting stops counting).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: terminal tables; csv: the main table with a total row; md: GitHub markdown; "
                   "html: a self-contained page with charts.")
@click.option("--full-stacks", is_flag=True,
              help="Show launching stacks whole (they are folded to their top frames, the launch's end; the HTML "
                   "page unfolds one on a click).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
              help="Write to this file instead of stdout.")
@click.pass_obj
def cost(settings: Settings, since: str, until: str, price_text: str | None, by_text: str, node: str | None,
         top: int, max_gap_s: float, full_stacks: bool, fmt: str, output: Path | None) -> None:
    """GPU-hours over the range, split into busy and idle, and what they cost, per --by group; plus GPU time by
    kernel and the CPU stacks that launched the most of it.

    A GPU-hour is an hour of NVML readings with a utilization value; busy hours weigh each reading's time by its
    utilization, idle hours are the rest (see sql/queries/gpu_idle_time.sql for the exact rule).
    """
    if price_text is None:
        raise click.ClickException("give --price-per-gpu-hour PRICE (what one GPU-hour costs)")
    try:
        price = parse_price(price_text)
        by = parse_by(by_text)
    except CostReportError as exc:
        raise click.ClickException(str(exc)) from None
    start, end = time_range(since, until)
    try:
        # transient, and only on a terminal: a spinner for fleets where the readings take a while to add up
        with Console(stderr=True).status("adding up GPU-hours…"), query_target(settings) as target:
            result = build_report(target, since=start, until=end, price=price, by=by, node=node or "", top=top,
                                  max_gap_s=max_gap_s, full_stacks=full_stacks)
    except QueryError as exc:
        raise click.ClickException(str(exc)) from None
    if fmt == "csv":
        text = to_csv(result)
    elif fmt == "md":
        text = to_markdown(result)
    elif fmt == "html":
        text = to_html(result)
    else:
        width = shutil.get_terminal_size((160, 24)).columns if output is None and sys.stdout.isatty() else 160
        text = to_text(result, width)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"wrote the {fmt} report to {output}", err=True)
