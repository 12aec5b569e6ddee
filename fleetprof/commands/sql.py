"""`fleetprof sql`: one read-only statement against the store, printed as a table, CSV or JSON."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleetprof.query_client import QueryError, query_target
from fleetprof.settings import Settings

FORMATS = ("table", "csv", "json")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def emit(columns: list[str], rows: list[list[Any]], fmt: str) -> None:
    """Print a result: a rich table, CSV with a header row, or JSON (a list of objects, one per row)."""
    if fmt == "json":
        click.echo(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], ensure_ascii=False, indent=2))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_cell(v) for v in row] for row in rows)
    else:
        table = Table(show_edge=False, header_style="bold")
        first = rows[0] if rows else [None] * len(columns)
        for name, sample in zip(columns, first, strict=True):
            numeric = isinstance(sample, int | float) and not isinstance(sample, bool)
            table.add_column(name, justify="right" if numeric else "left", overflow="fold")
        for row in rows:
            table.add_row(*(Text(_cell(v)) for v in row))  # Text: '[kernel.kallsyms]' is no markup tag
        Console(soft_wrap=False).print(table)


def parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    """k=v pairs to a dict; the text is typed by the statement's {k:Type} placeholder, server-side."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.ClickException(f"--param wants name=value, got {pair!r}")
        params[key.strip()] = value
    return params


@click.command("sql")
@click.argument("statement", required=False)
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read the statement from this file instead.")
@click.option("--param", "-p", "params", multiple=True, metavar="NAME=VALUE",
              help="Bind {NAME:Type} in the statement (repeatable).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.pass_obj
def sql(settings: Settings, statement: str | None, file: Path | None, params: tuple[str, ...], fmt: str) -> None:
    """Run one read-only statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) against the store.

    Goes through the API of the process that owns the store if one answers, else opens the store itself.
    """
    if (statement is None) == (file is None):
        raise click.ClickException("give either a statement or --file, not both or neither")
    text = file.read_text() if file is not None else (statement or "")
    bound = parse_params(params)
    try:
        with query_target(settings) as target:
            columns, rows = target.sql(text, bound)
    except QueryError as exc:
        raise click.ClickException(str(exc)) from None
    emit(columns, rows, fmt)
