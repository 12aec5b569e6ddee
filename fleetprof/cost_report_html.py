"""A CostReport as one self-contained HTML page: the summary, inline SVG charts (busy/idle GPU-hours per group as
stacked bars, GPU time of the top kernels as bars) and the report's tables. No scripts, fonts or external URLs."""

from __future__ import annotations

from html import escape

from fleetprof.cost_report import CostReport
from fleetprof.cost_report_render import (
    BY_TITLES,
    Section,
    hours_text,
    key_cells,
    money_text,
    sections,
    summary_lines,
)

CHART_GROUPS = 30  # bars in the busy/idle chart; the table below it has every group
LABEL_W, BAR_W, VALUE_W, ROW_H, BAR_H, TOP_PAD = 260, 460, 250, 22, 15, 28
LABEL_CHARS = 40

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d232b; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
ul.summary { padding-left: 18px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e3e6ea; vertical-align: top; }
th { text-align: left; background: #f4f6f8; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.stack { font-family: ui-monospace, monospace; font-size: 12px; word-break: break-all; max-width: 780px; }
td.stack summary { cursor: pointer; } td.stack details[open] summary { color: #69727d; }
tr.total td { font-weight: 600; border-top: 2px solid #9aa3ad; }
svg text { font: 12px system-ui, sans-serif; fill: #1d232b; }
.busy { fill: #2f7d4f; } .idle { fill: #c9cfd6; } .kernel { fill: #3b6fb6; }
"""


def _short(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"


def _bars(rows: list[tuple[str, list[tuple[float, str]], str]], legend: list[tuple[str, str]], title: str) -> str:
    """Horizontal bars, one per (label, [(value, css class), ...] stacked left to right, value text)."""
    scale = max((sum(v for v, _ in parts) for _, parts, _ in rows), default=0.0) or 1.0
    height = TOP_PAD + ROW_H * max(len(rows), 1)
    width = LABEL_W + BAR_W + VALUE_W
    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{escape(title)}">']
    x = LABEL_W
    for text, css in legend:
        out.append(f'<rect x="{x}" y="4" width="12" height="12" class="{css}"/>'
                   f'<text x="{x + 16}" y="14">{escape(text)}</text>')
        x += 24 + 8 * len(text)
    for i, (label, parts, value) in enumerate(rows):
        y = TOP_PAD + i * ROW_H
        out.append(f'<g><title>{escape(label)}: {escape(value)}</title>'
                   f'<text x="{LABEL_W - 8}" y="{y + 12}" text-anchor="end">{escape(_short(label))}</text>')
        x0 = float(LABEL_W)
        for v, css in parts:
            w = BAR_W * v / scale
            out.append(f'<rect x="{x0:.2f}" y="{y}" width="{w:.2f}" height="{BAR_H}" class="{css}"/>')
            x0 += w
        out.append(f'<text x="{LABEL_W + BAR_W + 8}" y="{y + 12}">{escape(value)}</text></g>')
    if not rows:
        out.append(f'<text x="{LABEL_W}" y="{TOP_PAD + 12}">no data in this range</text>')
    out.append("</svg>")
    return "".join(out)


def busy_idle_chart(report: CostReport) -> str:
    """Stacked busy/idle GPU-hours per group (the fleet's GPUs as one bar for --by kernel)."""
    if report.by == "kernel":
        items = [("all GPUs", report.gpus)] if report.gpus.gpu else []
    else:
        items = [(" / ".join(key_cells(report, h.key)), h) for h in report.groups[:CHART_GROUPS]]
    rows = [(label, [(h.busy, "busy"), (h.idle, "idle")],
             f"{hours_text(h.busy)} h busy + {hours_text(h.idle)} h idle, cost {money_text(report.cost(h.gpu))}")
            for label, h in items]
    return _bars(rows, [("busy", "busy"), ("idle", "idle")], "busy and idle GPU-hours")


def kernels_chart(report: CostReport) -> str:
    """GPU-hours of the top kernels."""
    rows = [(k.name, [(k.hours, "kernel")], f"{hours_text(k.hours)} h, cost {money_text(report.cost(k.hours))}")
            for k in report.kernels[:report.top]]
    return _bars(rows, [("kernel GPU-hours", "kernel")], "GPU-hours of the top kernels")


def _table(section: Section, whole: list[str] | None = None) -> str:
    """A section as a table; `whole`: the unfolded first cell of each row, a click away (<details>) where the
    section shows it folded."""
    stack_column = section.columns[0] in ("launching stack", "kernel")

    def cell(tag: str, text: str, i: int, full: str | None = None) -> str:
        css = "num" if section.numeric[i] else ("stack" if stack_column and i == 0 else "")
        attr = f' class="{css}"' if css else ""
        if full is not None and full != text:
            return (f"<{tag}{attr}><details><summary>{escape(text)}</summary>{escape(full)}</details></{tag}>")
        return f"<{tag}{attr}>{escape(text)}</{tag}>"

    out = ["<table><thead><tr>", *(cell("th", c, i) for i, c in enumerate(section.columns)), "</tr></thead><tbody>"]
    for r, row in enumerate(section.rows):
        out += ["<tr>", *(cell("td", c, i, whole[r] if whole and i == 0 else None) for i, c in enumerate(row)),
                "</tr>"]
    if section.total is not None:
        out += ['<tr class="total">', *(cell("td", c, i) for i, c in enumerate(section.total)), "</tr>"]
    out.append("</tbody></table>")
    if not section.rows:
        out.append("<p><em>none in this range</em></p>")
    return "".join(out)


def to_html(report: CostReport) -> str:
    """The whole page."""
    title = f"GPU cost by {BY_TITLES[report.by]}"
    body = [f"<h1>{escape(title)}</h1>", '<ul class="summary">',
            *(f"<li>{escape(line)}</li>" for line in summary_lines(report)), "</ul>",
            "<h2>Busy and idle GPU-hours</h2>", busy_idle_chart(report),
            "<h2>GPU-hours of the top kernels</h2>", kernels_chart(report)]
    for section in sections(report):
        whole = [s.name for s in report.stacks] if section.columns[0] == "launching stack" else None
        body += [f"<h2>{escape(section.title)}</h2>", _table(section, whole)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
