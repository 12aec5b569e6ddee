"""Result tables for people: the `table` output format of `fleetprof sql` and `fleetprof query`.

A table is never folded mid-word. In a terminal it fits the terminal's width (COLUMNS where set): every row stays on
one line and a text cell too long for its column is cut with "…" (the full value is in --format csv/json, or in a
pipe). Anywhere else (a pipe, a file) it is printed at the natural width of its content, nothing cut, no trailing
spaces and no colour, so `| less -S`, `| grep` and golden tests see whole values.

Raw query results (the `sql` command, named queries) show some cells for people, chosen by the column's name alone:

- nanoseconds: a column named `ns` or ending in `_ns` (duration_ns, gpu_ns, kernel_ns, all_ns) shows as a duration
  in the largest unit that keeps it at 1 or more, to four significant digits: "850 ns", "12.5 µs", "1.234 ms",
  "2.5 s", "12.5 min", "3.2 h";
- shares: a column named `share` or `ratio`, or ending in `_share` or `_ratio`, holds a fraction of a whole (0..1) and
  shows as a percentage with one decimal: 0.123 -> "12.3%".

Only numbers are changed (a null stays empty, text stays as it is); CSV and JSON always keep the raw values.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.box import SIMPLE_HEAD
from rich.console import Console
from rich.table import Table
from rich.text import Text

NATURAL_WIDTH = 100_000  # wider than any table: a non-terminal table takes the width of its content
GIB = 1024**3
# larger units first: (nanoseconds in one, its name)
_DURATION_UNITS = [(3_600 * 10**9, "h"), (60 * 10**9, "min"), (10**9, "s"), (10**6, "ms"), (10**3, "µs")]


def cell(value: Any) -> str:
    """A raw value as table text: null empty, lists and objects as JSON, the rest as str()."""
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def duration_ns(ns: float) -> str:
    """Nanoseconds as "850 ns", "1.234 ms", "2.5 s": the largest unit that keeps the value at 1 or more."""
    size, unit = next(((size, unit) for size, unit in _DURATION_UNITS if abs(ns) >= size), (1, "ns"))
    value = ns / size
    return f"{value:,.0f} {unit}" if abs(value) >= 1000 else f"{value:.4g} {unit}"  # 1,234 h, not 1.234e+03 h


def percent(fraction: float) -> str:
    """A fraction of a whole as a percentage: 0.123 -> "12.3%"."""
    return f"{100.0 * fraction:.1f}%"


def _is_ns(name: str) -> bool:
    return name == "ns" or name.endswith("_ns")


def _is_share(name: str) -> bool:
    return name in ("share", "ratio") or name.endswith(("_share", "_ratio"))


def column_formatter(name: str) -> Callable[[Any], str]:
    """How a raw column's cells show in a table, by the column's name (see the module's docstring)."""
    if _is_ns(name):
        return lambda v: duration_ns(v) if is_number(v) else cell(v)
    if _is_share(name):
        return lambda v: percent(v) if is_number(v) else cell(v)
    return cell


def table_cells(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> tuple[list[list[str]], list[bool]]:
    """A raw result's cells as table text, and which columns are right-aligned (those holding numbers)."""
    formats = [column_formatter(name) for name in columns]
    cells = [[fmt(v) for fmt, v in zip(formats, row, strict=True)] for row in rows]
    right = [any(is_number(row[i]) for row in rows) for i in range(len(columns))]
    return cells, right


def build_table(headers: Sequence[str], cells: Sequence[Sequence[str]], right: Sequence[bool],
                whole: Sequence[bool] | None = None) -> Table:
    """The rich table: a rule under the header, two spaces between columns, no borders; a cell never wraps (too long:
    cut with "…"). When the table is too wide, text columns give way and right-aligned ones (numbers) and those
    marked `whole` (times) keep their width."""
    table = Table(box=SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, header_style="bold")
    for i, (header, is_right) in enumerate(zip(headers, right, strict=True)):
        keep = is_right or bool(whole and whole[i])
        table.add_column(header, justify="right" if is_right else "left", no_wrap=keep)
    for row in cells:
        # Text: '[kernel.kallsyms]' is no markup tag; no_wrap + ellipsis: one line per row, never folded mid-word
        table.add_row(*(Text(c, no_wrap=True, overflow="ellipsis") for c in row))
    return table


def render_table(headers: Sequence[str], cells: Sequence[Sequence[str]], right: Sequence[bool],
                 whole: Sequence[bool] | None = None, width: int | None = None) -> str:
    """The table as plain text at `width` columns (None: the content's natural width), without trailing spaces."""
    out = io.StringIO()
    console = Console(file=out, width=width or NATURAL_WIDTH, color_system=None, soft_wrap=False,
                      force_terminal=False, legacy_windows=False)
    console.print(build_table(headers, cells, right, whole))
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


def print_table(headers: Sequence[str], cells: Sequence[Sequence[str]], right: Sequence[bool],
                whole: Sequence[bool] | None = None) -> None:
    """The table on stdout: fitted to a terminal (with a bold header), at its natural width anywhere else; nothing for
    a result without columns (an empty result of some stores)."""
    if not headers:
        return
    if sys.stdout.isatty():
        Console(soft_wrap=False).print(build_table(headers, cells, right, whole))
    else:
        click.echo(render_table(headers, cells, right, whole), nl=False)


def say_no_rows(reason: str | None = None) -> None:
    """"0 rows" on stderr, with why where the caller knows."""
    click.echo(f"0 rows: {reason}" if reason else "0 rows", err=True)
