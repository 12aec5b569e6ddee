"""A CostReport as text: CSV (the main table, machine-readable), GitHub markdown, and a terminal table.

Every human format shows the same sections (see `sections`); fleetprof/cost_report_html.py adds charts to them.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleetprof.cost_report import WORKLOAD_BY, CostReport, Hours, KernelTime
from fleetprof.simulated_sources import simulated_line
from fleetprof.workload_filters import UNATTRIBUTED

NO_CONTAINER = "(no container)"
CENT = Decimal("0.01")
BY_TITLES = {"node": "node", "gpu": "GPU", "process": "process", "container": "container", "kernel": "kernel",
             "namespace": "namespace", "pod": "pod", "job": "job", "team": "team"}
SIMULATED_MARK = " (simulated)"  # after a node whose NVML readings were simulated
STACK_TOP_FRAMES = 4  # frames of a launching stack shown, the launch's end; --full-stacks shows them all


@dataclass(frozen=True)
class Section:
    """One titled table of formatted cells; `numeric` columns align right; `total` is an optional last row."""

    title: str
    columns: list[str]
    numeric: list[bool]
    rows: list[list[str]]
    total: list[str] | None = None


# --- numbers for people -------------------------------------------------------------------------------------------


def hours_text(hours: float) -> str:
    return f"{hours:,.3f}"


def money_text(amount: float) -> str:
    """Two decimals, half up as on an invoice (format() would round 0.625 to 0.62)."""
    if 0 < amount < 0.005:
        return "<0.01"
    return f"{Decimal(repr(amount)).quantize(CENT, ROUND_HALF_UP):,}"


def pct_text(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def duration_text(hours: float) -> str:
    """A span of GPU time in the unit that reads best: ms, s, min or h."""
    seconds = hours * 3600
    if seconds < 1:
        return f"{seconds * 1000:,.1f} ms"
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{hours:,.2f} h"


def range_text(report: CostReport) -> str:
    return (f"{report.since.isoformat(timespec='seconds')} to {report.until.isoformat(timespec='seconds')}"
            + (f", node {report.node}" if report.node else ""))


def key_cells(report: CostReport, key: tuple) -> list[str]:
    cells = [str(k) for k in key]
    if report.by == "container" and cells == [""]:
        cells = [NO_CONTAINER]
    if report.by in ("node", "gpu", "process") and cells[0] in report.simulated.get("nvml", ()):
        cells[0] += SIMULATED_MARK  # these GPU-hours come from the simulated NVML library's readings
    return cells


def folded_stack(stack: str, full: bool = False) -> str:
    """A launching stack ('root;…;leaf') as its top frames, those nearest the launch, after how many it leaves out:
    '[+12 frames];forward;linear;cublasGemm;launch'. Whole with `full`."""
    frames = stack.split(";")
    if full or len(frames) <= STACK_TOP_FRAMES:
        return stack
    return ";".join([f"[+{len(frames) - STACK_TOP_FRAMES} frames]", *frames[-STACK_TOP_FRAMES:]])


# --- sections -----------------------------------------------------------------------------------------------------


def summary_lines(report: CostReport) -> list[str]:
    """The report's head: range, price, the fleet's GPU-hours and their cost, kernel time."""
    g = report.gpus
    lines = [simulated_line(kind, nodes) for kind, nodes in sorted(report.simulated.items())]
    lines += [
        f"Range: {range_text(report)} (UTC)",
        f"Price: {report.price:g} per GPU-hour",
        f"GPUs: {hours_text(g.gpu)} GPU-hours, busy {hours_text(g.busy)} ({pct_text(g.busy, g.gpu)}), "
        f"idle {hours_text(g.idle)} ({pct_text(g.idle, g.gpu)}): cost {money_text(report.cost(g.gpu))}, "
        f"of which idle {money_text(report.cost(g.idle))}",
        f"Kernels: {duration_text(report.kernel_hours)} of GPU kernel time ({hours_text(report.kernel_hours)} "
        f"GPU-hours): cost {money_text(report.cost(report.kernel_hours))}",
    ]
    if report.unknown_hours:
        lines.append(f"Not counted: {hours_text(report.unknown_hours)} GPU-hours of readings without a utilization "
                     "value")
    if report.by in ("process", "container"):
        lines.append("Process GPU-hours: time a process was listed on a GPU with a utilization sample; processes "
                     "sharing a GPU each count")
    if report.by in WORKLOAD_BY:
        lines.append("Workload GPU-hours: a GPU's go to the pod that holds it, else to the workloads of the processes "
                     f"listed on it (split evenly), else to '{UNATTRIBUTED}'")
    lines.append(f"Each NVML reading stands for the time to the next one, at most {report.max_gap_s:g} s "
                 "(see sql/queries/gpu_idle_time.sql)")
    return lines


def _hours_row(report: CostReport, h: Hours, key: list[str]) -> list[str]:
    return [*key, hours_text(h.gpu), hours_text(h.busy), hours_text(h.idle), pct_text(h.busy, h.gpu),
            money_text(report.cost(h.gpu)), money_text(report.cost(h.busy)), money_text(report.cost(h.idle))]


def groups_section(report: CostReport) -> Section:
    """GPU-hours and cost per --by group, with the total."""
    keys = report.key_columns
    columns = [*keys, "GPU-hours", "busy h", "idle h", "busy %", "cost", "busy cost", "idle cost"]
    rows = [_hours_row(report, h, key_cells(report, h.key)) for h in report.groups]
    total = _hours_row(report, report.total, ["total"] + [""] * (len(keys) - 1))
    return Section(f"GPU-hours by {BY_TITLES[report.by]}", columns, [False] * len(keys) + [True] * 7, rows, total)


def _time_row(report: CostReport, k: KernelTime, share_of: float | None) -> list[str]:
    row = [k.name, f"{k.launches:,}", duration_text(k.hours), hours_text(k.hours), money_text(report.cost(k.hours))]
    return row + ([pct_text(k.hours, share_of)] if share_of is not None else [])


def kernels_section(report: CostReport, limit: int | None) -> Section:
    """GPU time and cost per kernel: all of them for --by kernel, else the top ones."""
    kernels = report.kernels if limit is None else report.kernels[:limit]
    whole = report.kernel_hours
    columns = ["kernel", "launches", "GPU time", "GPU-hours", "cost", "share"]
    total = None
    if limit is None:
        total = ["total", f"{sum(k.launches for k in report.kernels):,}", duration_text(whole), hours_text(whole),
                 money_text(report.cost(whole)), pct_text(whole, whole)]
    title = "GPU time by kernel" if limit is None else "Top kernels"
    return Section(title, columns, [False] + [True] * 5, [_time_row(report, k, whole) for k in kernels], total)


def stacks_section(report: CostReport) -> Section:
    """The CPU stacks that launched the most GPU time, each folded to its top frames unless --full-stacks."""
    columns = ["launching stack", "launches", "GPU time", "GPU-hours", "cost"]
    stacks = [KernelTime(folded_stack(s.name, report.full_stacks), s.hours, s.launches) for s in report.stacks]
    return Section("Top launching stacks", columns, [False] + [True] * 4,
                   [_time_row(report, s, None) for s in stacks])


def sections(report: CostReport) -> list[Section]:
    """The tables of every human format, in order."""
    if report.by == "kernel":
        return [kernels_section(report, None), stacks_section(report)]
    return [groups_section(report), kernels_section(report, report.top), stacks_section(report)]


# --- formats ------------------------------------------------------------------------------------------------------


def _num(value: float) -> str:
    return f"{value:.6f}"


def to_csv(report: CostReport) -> str:
    """The main table with a total row, numbers with 6 decimals: GPU-hours and cost per group, or per kernel."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if report.by == "kernel":
        whole = report.kernel_hours
        writer.writerow(["kernel", "launches", "gpu_hours", "cost", "share"])
        for k in report.kernels:
            writer.writerow([k.name, k.launches, _num(k.hours), _num(report.cost(k.hours)),
                             _num(k.hours / whole if whole else 0.0)])
        writer.writerow(["total", sum(k.launches for k in report.kernels), _num(whole), _num(report.cost(whole)),
                         _num(1.0 if whole else 0.0)])
        return out.getvalue()
    keys = report.key_columns
    writer.writerow([*keys, "gpu_hours", "busy_hours", "idle_hours", "cost", "busy_cost", "idle_cost"])
    for h in [*report.groups, report.total]:
        key = list(h.key) if h is not report.total else ["total"] + [""] * (len(keys) - 1)
        writer.writerow([*key, _num(h.gpu), _num(h.busy), _num(h.idle), _num(report.cost(h.gpu)),
                         _num(report.cost(h.busy)), _num(report.cost(h.idle))])
    return out.getvalue()


def _md_cell(text: str) -> str:
    # a '|' would end the cell, a newline the row
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(section: Section) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(c) for c in section.columns) + " |",
             "|" + "|".join("---:" if n else "---" for n in section.numeric) + "|"]
    for row in section.rows:
        lines.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
    if section.total is not None:
        lines.append("| " + " | ".join(f"**{_md_cell(c)}**" if c else "" for c in section.total) + " |")
    if not section.rows:
        lines.append("")
        lines.append("_none in this range_")
    return lines


def to_markdown(report: CostReport) -> str:
    """GitHub markdown: a title, the summary as a list, then each section as a table."""
    lines = [f"# GPU cost by {BY_TITLES[report.by]}", ""]
    lines += [f"- {_md_cell(line)}" for line in summary_lines(report)]
    for section in sections(report):
        lines += ["", f"## {section.title}", "", *_md_table(section)]
    return "\n".join(lines) + "\n"


def to_text(report: CostReport, width: int | None = None) -> str:
    """Terminal tables (rich), as plain text."""
    out = io.StringIO()
    console = Console(file=out, width=width or 160, soft_wrap=False, color_system=None)
    console.print(Text(f"GPU cost by {BY_TITLES[report.by]}", style="bold"))
    for line in summary_lines(report):
        console.print(Text(line))
    for section in sections(report):
        table = Table(title=section.title, title_justify="left", show_edge=False, header_style="bold")
        for name, numeric in zip(section.columns, section.numeric, strict=True):
            table.add_column(name, justify="right" if numeric else "left", overflow="fold")
        for row in section.rows:
            table.add_row(*(Text(c) for c in row))  # Text: '[unknown 0x…]' is no markup tag
        if section.total is not None:
            table.add_section()
            table.add_row(*(Text(c, style="bold") for c in section.total))
        console.print()
        console.print(table)
    return out.getvalue()
