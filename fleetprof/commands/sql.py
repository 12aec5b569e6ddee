"""`fleetprof sql`: one read-only statement against the store, printed as a table, CSV or JSON.

A statement (inline or from --file) is read the way named queries are: `-- @include <query>` lines take in a named
query's statement as a subquery (or a piece of one from sql/parts/: a filter, a join), its `{name:Type}` placeholders
take --param text typed by the placeholder (`since=1h` is a time, `pid=12` an integer) and `-- @default name = text`
lines fill in what is not given, so `fleetprof sql --file sql/queries/<name>.sql` needs only the meaningful parameters.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import click

from fleetprof.query_client import QueryError, query_target
from fleetprof.settings import Settings
from fleetprof.store import NamedQuery, ParamError, bind_named, parse_query, query_file
from fleetprof.table_format import cell, print_table, say_no_rows, table_cells

FORMATS = ("table", "csv", "json")
INLINE_NAME = "the statement"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DATETIME64_RE = re.compile(r"DateTime64\(\s*(\d+)")


def emit(columns: list[str], rows: list[list[Any]], fmt: str, empty: str | None = None) -> None:
    """Print a result: a table (see fleetprof.table_format: nanoseconds and shares shown for people by column name),
    CSV with a header row, or JSON (a list of objects, one per row), the last two with the raw values.

    An empty result also says "0 rows" on stderr, followed by `empty` (why, where the caller knows).
    """
    if fmt == "json":
        click.echo(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], ensure_ascii=False, indent=2))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([cell(v) for v in row] for row in rows)
    else:
        print_table(columns, *table_cells(columns, rows))
    if not rows:
        say_no_rows(empty)


def parse_params(pairs: tuple[str, ...]) -> dict[str, str]:
    """k=v pairs to a dict of text; bind_statement types them by the statement's {k:Type} placeholders."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.ClickException(f"--param wants name=value, got {pair!r}")
        params[key.strip()] = value
    return params


def wire_value(ch_type: str, value: Any) -> Any:
    """A typed value in a form ClickHouse reads the same from the store's client and from /api/sql's JSON.

    Times go as epoch seconds with as many decimals as the placeholder keeps (DateTime: none, DateTime64(3): three),
    truncated like clickhouse-connect truncates: epoch text has no time zone to misread, whatever the server's zone,
    while ISO-8601 with a 'T' or an offset is not accepted for a DateTime parameter at all.
    """
    if isinstance(value, datetime):
        micros = (value - _EPOCH) // timedelta(microseconds=1)
        seconds, fraction = divmod(micros, 1_000_000)
        match = _DATETIME64_RE.search(ch_type)
        digits = int(match.group(1)) if match else 0
        if digits == 0:
            return str(seconds)
        return f"{seconds}.{f'{fraction:06d}'.ljust(digits, '0')[:digits]}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, date):
        return value.isoformat()
    return value


def bind_statement(query: NamedQuery, given: dict[str, str]) -> dict[str, Any]:
    """Every placeholder's value (given text typed by its placeholder, else its `-- @default`), ready to send."""
    unknown = sorted(set(given) - set(query.params))
    if unknown:
        known = ", ".join(query.params) or "none"
        raise click.ClickException(f"{query.name} has no parameter {', '.join(unknown)} (known: {known})")
    try:
        bound = bind_named(query, given)
    except ParamError as exc:
        raise click.ClickException(str(exc)) from None
    return {name: wire_value(query.params[name], value) for name, value in bound.items()}


@click.command("sql")
@click.argument("statement", required=False)
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read the statement from this file instead (its `-- @default name = value` lines apply).")
@click.option("--param", "-p", "params", multiple=True, metavar="NAME=VALUE",
              help="Bind {NAME:Type} in the statement (repeatable); times take 1h, 7d, epoch or ISO-8601.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.pass_obj
def sql(settings: Settings, statement: str | None, file: Path | None, params: tuple[str, ...], fmt: str) -> None:
    """Run one read-only statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) against the store.

    Goes through the API of the process that owns the store if one answers, else opens the store itself.
    """
    if (statement is None) == (file is None):
        raise click.ClickException("give either a statement or --file, not both or neither")
    query = query_file(file) if file is not None else parse_query(INLINE_NAME, statement or "")
    bound = bind_statement(query, parse_params(params))
    try:
        with query_target(settings) as target:
            columns, rows = target.sql(query.sql, bound)
    except QueryError as exc:
        raise click.ClickException(str(exc)) from None
    emit(columns, rows, fmt)
