"""The SQL files: named queries (sql/queries, with the parts they include from sql/parts, their placeholders and
defaults, and the values bound to them) and the numbered migrations (sql/migrations, split into statements).
Re-exported by fleetprof.store, which runs them."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fleetprof.settings import SQL_DIR
from fleetprof.store_errors import ParamError, UnknownQuery
from fleetprof.store_params import _unwrap, coerce_param

MIGRATIONS_DIR = SQL_DIR / "migrations"
QUERIES_DIR = SQL_DIR / "queries"
PARTS_DIR = SQL_DIR / "parts"

_NAME_RE = re.compile(r"^[a-z0-9_]+$")
_PLACEHOLDER_RE = re.compile(r"\{(\w+):([^{}]+)\}")
_DEFAULT_RE = re.compile(r"^--\s*@default\s+(\w+)\s*=[ \t]*(.*?)\s*$", re.MULTILINE)
_INCLUDE_RE = re.compile(r"^([ \t]*)--\s*@include\s+(\S+)\s*$", re.MULTILINE)
_HEADER_RE = re.compile(r"\A(?:[ \t]*(?:--.*)?\n)*")
_STATEMENT_END_RE = re.compile(r";[ \t]*$", re.MULTILINE)
_MIGRATION_RE = re.compile(r"^(\d{4})_\w+\.sql$")


@dataclass(frozen=True)
class NamedQuery:
    """One sql/queries/<name>.sql: its text, its placeholders' ClickHouse types, and the defaults it declares."""

    name: str
    sql: str
    params: dict[str, str]
    defaults: dict[str, str]


def named_queries() -> list[str]:
    """Names of the queries under sql/queries/."""
    return sorted(p.stem for p in QUERIES_DIR.glob("*.sql") if _NAME_RE.match(p.stem))


def named_query(name: str) -> NamedQuery:
    """Load sql/queries/<name>.sql; placeholders are `{name:Type}`, defaults are `-- @default name = text` lines."""
    path = QUERIES_DIR / f"{name}.sql"
    # The name comes from URLs and command lines: never let it walk out of sql/queries/
    if not _NAME_RE.match(name) or not path.is_file():
        raise UnknownQuery(f"no named query {name!r} (known: {', '.join(named_queries())})")
    return _load_named(path, _newest_sql())


def parse_query(name: str, sql: str) -> NamedQuery:
    """Any statement read the way named queries are: each `-- @include <name>` line replaced by that named query's
    statement or by sql/parts/<name>.sql (without its comment header, indented like the line), then its `{name:Type}`
    placeholders, its own and the included ones, and its own `-- @default` lines."""
    expanded = _INCLUDE_RE.sub(
        lambda line: textwrap.indent(_HEADER_RE.sub("", _included(line.group(2))).rstrip(), line.group(1)), sql)
    params: dict[str, str] = {}
    for pname, ptype in _PLACEHOLDER_RE.findall(expanded):
        params.setdefault(pname, ptype.strip())
    return NamedQuery(name, expanded, params, dict(_DEFAULT_RE.findall(sql)))


def query_file(path: Path) -> NamedQuery:
    """A .sql file anywhere (`fleetprof sql --file`) read like a named query, named after the file."""
    return parse_query(path.name, path.read_text())


@cache
def _load_named(path: Path, _mtime: int) -> NamedQuery:
    return parse_query(path.stem, path.read_text())


def _included(name: str) -> str:  # sql/parts/<name>.sql (a filter, a join: no statement of its own) or a named query
    part = PARTS_DIR / f"{name}.sql"
    return (_load_named(part, _newest_sql()) if _NAME_RE.match(name) and part.is_file() else named_query(name)).sql


def _newest_sql() -> int:  # the cache key: an edit to a query or a part that a query includes shows at once
    return max(p.stat().st_mtime_ns for d in (QUERIES_DIR, PARTS_DIR) for p in d.glob("*.sql"))


def split_statements(text: str) -> list[str]:
    """Split a migration file at `;` ending a line; drop pieces that hold only comments."""
    pieces = _STATEMENT_END_RE.split(text)
    return [p.strip() for p in pieces if any(ln.strip() and not ln.strip().startswith("--") for ln in p.splitlines())]


def migration_files() -> list[tuple[int, str, Path]]:
    """(version, name, path) of every sql/migrations/NNNN_name.sql, in order."""
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        match = _MIGRATION_RE.match(path.name)
        if match:
            found.append((int(match.group(1)), path.stem, path))
    return found


# --- parameters -----------------------------------------------------------------------------------------------------

def bind_named(query: NamedQuery, params: dict[str, Any]) -> dict[str, Any]:
    """The values for every placeholder: given ones (text coerced by type), then declared defaults."""
    unknown = sorted(set(params) - set(query.params))
    if unknown:
        raise ParamError(f"{query.name} has no parameter {', '.join(unknown)} (takes {', '.join(query.params)})")
    bound: dict[str, Any] = {}
    for pname, ptype in query.params.items():
        if pname in params:
            value = params[pname]
        elif pname in query.defaults:
            value = query.defaults[pname]
        else:
            raise ParamError(f"{query.name} needs parameter {pname} ({ptype})")
        if isinstance(value, str) and not _unwrap(ptype).startswith(("String", "FixedString")):
            try:
                value = coerce_param(ptype, value)
            except ValueError as exc:
                raise ParamError(f"parameter {pname}: {exc}") from None
        bound[pname] = value
    return bound
