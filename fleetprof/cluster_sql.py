"""sql/cluster/, the schema of a sharded, replicated ClickHouse cluster, generated from sql/migrations/: each
sql/cluster/NNNN_name.sql from the migration of the same name, so that every table's columns, codecs, engine, keys,
partitions, TTL and settings are written once, in the migration.

    python -m fleetprof.cluster_sql           # rewrite sql/cluster/NNNN_*.sql
    python -m fleetprof.cluster_sql --check   # exit 1, naming every cluster file that differs from its migration

A module of fleetprof rather than a script beside the files: it reads the migrations with the store's own
migration_files and split_statements (the statements the store applies are the ones turned into cluster statements),
and tests/test_cluster_sql_files.py imports it to regenerate in memory and compare.

What a migration says for the cluster, in comment lines above a statement (a single node ignores them):
  * `-- @cluster sharded by <expression>` above CREATE TABLE: `<name>_local`, a Replicated table with one replica set
    per shard, behind a Distributed table `<name>` with that sharding key. Above CREATE VIEW: the view per node as
    `<name>_local` over the local tables (and over the `_local` views before it), behind a Distributed `<name>`.
  * `-- @cluster on every node` above CREATE TABLE: one Replicated table whose replica set spans the cluster, so each
    node holds it whole; above CREATE VIEW or CREATE DICTIONARY: the same view or dictionary on every node, reading
    the tables it reads on one node. SYSTEM RELOAD DICTIONARY runs ON CLUSTER.
  * `-- Cluster: <text>`, up to the next `--` line, blank line or directive: notes copied above the statement's
    cluster form.
The rest follows from those: every CREATE runs ON CLUSTER; a materialized view runs on every node from the local table
to the local table; an ALTER of a table on every node and an INSERT run as they are (replication carries them); each
file ends by recording its version in schema_migrations, which is why `fleetprof db migrate` finds nothing to do.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fleetprof.store import MIGRATIONS_DIR, migration_files, split_statements
from fleetprof.store_statements import store_sql

CLUSTER_DIR = MIGRATIONS_DIR.parent / "cluster"
COMMAND = "python -m fleetprof.cluster_sql"
LINE_LIMIT = 120

# The cluster's placeholders: ClickHouse fills {cluster}, {shard} and {replica} from each node's macros, {database}
# with the table's database.
ON_CLUSTER = " ON CLUSTER '{cluster}'"
SHARD_PATH, SHARD_REPLICA = "/clickhouse/tables/{{shard}}/{{database}}/{table}", "{replica}"
# one replica set over every node: a replica name unique across it, also where {replica} repeats from shard to shard
WHOLE_PATH, WHOLE_REPLICA = "/clickhouse/tables/all/{{database}}/{table}", "{shard}-{replica}"
# a table a migration swaps in with EXCHANGE TABLES: the live table then carries the copy's name and its path, so the
# copy's path is its own UUID's (the same on every replica of a CREATE ON CLUSTER), and a new copy never meets it
EXCHANGED_PATH = "/clickhouse/tables/{uuid}/{shard}"
# the statements a migration does not hold: a Distributed table in front of a table's or a view's local part, and the
# version record ending each file
DISTRIBUTED_TABLE = """{create} {name}{on_cluster}
(
{columns}
)
ENGINE = Distributed('{{cluster}}', currentDatabase(), {local}, {key})"""
DISTRIBUTED_VIEW = """CREATE TABLE IF NOT EXISTS {name}{on_cluster} AS {local}
ENGINE = Distributed('{{cluster}}', currentDatabase(), {local}, {key})"""
# an ALTER of a sharded table runs on its local tables, and its new columns reach the Distributed table in front
ALTER_LOCAL = "ALTER TABLE {name}_local{on_cluster}"
ALTER_DISTRIBUTED = "ALTER TABLE {name}{on_cluster}\n    {added}"
DROP_VIEW = "DROP VIEW IF EXISTS {name}{on_cluster}"
DROP_TABLE = "DROP TABLE IF EXISTS {name}{on_cluster}{sync}"
EXCHANGE = "EXCHANGE TABLES {first} AND {second}{on_cluster}"
# a table given another's parts (ATTACH PARTITION ALL FROM) on one node: on a cluster the rows are copied through the
# Distributed tables instead, each back to its shard (ATTACH ... FROM acts on one replica's parts: ON CLUSTER every
# replica would attach its own, and replicas that lag attach less)
COPY_ROWS = """INSERT INTO {into} SELECT * FROM {source}
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1"""
# what an ALTER of a sharded table may do: add columns and keys (the new columns reach the Distributed table too), and
# change what only the local tables have (settings, TTL, a column's codec)
LOCAL_ALTERS = ("ADD COLUMN ", "MODIFY ORDER BY ", "MODIFY SETTING ", "MODIFY TTL ", "MODIFY COLUMN ")
# a MODIFY COLUMN of a sharded table changes the codec only: a new type would have to reach the Distributed table too
_CODEC_ONLY_RE = re.compile(r"^MODIFY COLUMN \w+ CODEC\([^;]*\)$")
RECORD = "INSERT INTO schema_migrations (version, name, applied_at) VALUES ({version}, '{name}', now())"
# first in a file that rebuilds tables (EXCHANGE TABLES), as `fleetprof db migrate` refuses on one node
# (fleetprof/rebuild_guard.py), over the same sink_batches statement, every topic: clickhouse-client stops the file at
# its error
REBUILD_GUARD = """\
-- Cluster: this file rebuilds tables, whose deduplication logs start empty: a sink batch left unfinished would be
-- stored twice once a sink writes it again (fleetprof/rebuild_guard.py). So it stops here while one is unfinished:
-- start the sink of the version that began it (it finishes the batch by itself), stop the sinks, run the file again;
-- or, accepting those rows twice, run it from the next statement.
SELECT throwIf(count() > 0, 'fleetprof: a sink batch is unfinished, which this rebuild would store twice: see above')
           AS unfinished_sink_batches
FROM
(
{batches}
)
WHERE state = 'BEFORE'""".format(batches="\n".join(
    f"    {line}" for line in store_sql("sink_batches").replace("{topics:Array(String)}", "[]").splitlines()
    if not line.startswith("--")))

_DIRECTIVE_RE = re.compile(r"^--\s*@cluster\b\s*(.*?)\s*$")
_NOTE_RE = re.compile(r"^--\s*Cluster:")
_CREATE_RE = re.compile(
    r"^CREATE (?:OR REPLACE )?(TABLE|VIEW|MATERIALIZED VIEW|DICTIONARY) (?:IF NOT EXISTS )?(\w+)\b(.*)$")
_RELOAD_RE = re.compile(r"^SYSTEM RELOAD DICTIONARY (\w+)$")
_TARGET_RE = re.compile(r"^ TO (\w+) AS$")
_ENGINE_RE = re.compile(r"^ENGINE = (\w*)MergeTree(?:\((.*)\))?$", re.MULTILINE)
_REFERENCE_RE = re.compile(r"\b(FROM|JOIN)(\s+)(\w+)\b")
_ALTER_RE = re.compile(r"^ALTER TABLE (\w+)\b")
_DROP_VIEW_RE = re.compile(r"^DROP VIEW IF EXISTS (\w+)$")
_DROP_TABLE_RE = re.compile(r"^DROP TABLE IF EXISTS (\w+)( SYNC)?$")
_EXCHANGE_RE = re.compile(r"^EXCHANGE TABLES (\w+) AND (\w+)$")
_ATTACH_FROM_RE = re.compile(r"^ALTER TABLE (\w+) ATTACH PARTITION ALL FROM (\w+)$")
_CODEC_RE = re.compile(r"\s+CODEC\(.*\)$")
_DEDUP_RE = re.compile(r"\bnon_replicated_deduplication_window\b")


class ClusterSqlError(ValueError):
    """A migration the generator cannot turn into its cluster form; the message names the file and the statement."""


@dataclass
class Layout:
    """Where the migrations so far put each object: sharded ones (name -> key) live as `<name>_local` per shard."""

    sharded: dict[str, str] = field(default_factory=dict)
    every_node: set[str] = field(default_factory=set)
    # this file's: the tables it creates sharded (a DROP of one may come before its CREATE), those it exchanges, and
    # the CREATE body of each sharded table it made (an exchange gives the copy's columns to the Distributed table)
    created: set[str] = field(default_factory=set)
    exchanged: set[str] = field(default_factory=set)
    definitions: dict[str, str] = field(default_factory=dict)


def generate() -> dict[str, str]:
    """File name -> text of every sql/cluster/NNNN_name.sql, generated from the migrations in order."""
    layout = Layout()
    return {f"{name}.sql": generate_file(version, name, path.read_text(), layout)
            for version, name, path in migration_files()}


def generate_file(version: int, name: str, text: str, layout: Layout) -> str:
    """The cluster form of one migration; `layout` holds what the earlier migrations placed and learns this one's."""
    source = f"sql/migrations/{name}.sql"
    chunks, directives = [], 0
    pieces = split_statements(text)
    _plan_file(pieces, layout)
    for piece in pieces:
        lines = piece.splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("--"))
        where = f"{source}: {lines[start].strip()}"
        placement, notes = _read_comments(lines[:start], where)
        directives += placement is not None
        code = "\n".join(lines[start:])
        statements = _cluster_statements(code, placement, layout, where)
        chunks.append("\n".join([*notes, statements[0]]) + ";")
        chunks.extend(f"{statement};" for statement in statements[1:])
    if directives != sum(bool(_DIRECTIVE_RE.match(line.strip())) for line in text.splitlines()):
        raise ClusterSqlError(f"{source}: a `-- @cluster` line belongs in the comment lines right above a statement")
    if layout.exchanged:
        chunks.insert(0, REBUILD_GUARD + ";")
    chunks.append(RECORD.format(version=version, name=name) + ";")
    header = [f"-- Generated from {source} by `{COMMAND}`: do not edit.",
              "-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;",
              "-- sql/cluster/README.md says how a cluster differs from one node."]
    first = chunks[0]
    return "\n".join(header) + ("\n--\n" if first.startswith("--") else "\n") + "\n\n".join(chunks) + "\n"


def _plan_file(pieces: list[str], layout: Layout) -> None:
    """What the file creates sharded and what it exchanges, before its statements are generated in order."""
    layout.created, layout.exchanged, layout.definitions = set(), set(), {}
    for piece in pieces:
        lines = [line.strip() for line in piece.splitlines()]
        code = next(line for line in lines if line and not line.startswith("--"))
        sharded = any((m := _DIRECTIVE_RE.match(line)) and m.group(1).startswith("sharded by ") for line in lines)
        create = _CREATE_RE.match(code)
        if create and create.group(1) == "TABLE" and sharded:
            layout.created.add(create.group(2))
        exchange = _EXCHANGE_RE.match(code)
        if exchange:
            layout.exchanged |= {exchange.group(1), exchange.group(2)}


def _read_comments(lines: list[str], where: str) -> tuple[str | None, list[str]]:
    """The `-- @cluster` placement among a statement's leading comment lines, and its `-- Cluster:` paragraphs."""
    placement, notes, note = None, [], None
    for line in [*(raw.strip() for raw in lines), ""]:
        directive = _DIRECTIVE_RE.match(line)
        if directive or _NOTE_RE.match(line) or line in ("", "--"):  # the paragraph before ends here
            if note:
                notes += ["--", *note] if notes else note
            note = [line] if _NOTE_RE.match(line) else None
        elif note is not None:
            note.append(line)
        if directive and placement is not None:
            raise ClusterSqlError(f"{where}: two `-- @cluster` lines above one statement")
        placement = directive.group(1) if directive else placement
    return placement, notes


def _cluster_statements(code: str, placement: str | None, layout: Layout, where: str) -> list[str]:
    first, _, rest = code.partition("\n")
    create = _CREATE_RE.match(first)
    if create is None:
        if placement is not None:
            raise ClusterSqlError(f"{where}: `-- @cluster` places a table or a view, nothing else")
        attach = _ATTACH_FROM_RE.match(code)
        if attach:
            return _attach_from(attach.group(1), attach.group(2), layout, where)
        alter = _ALTER_RE.match(first)
        if alter and alter.group(1) in layout.sharded:
            return _sharded_alter(alter, code, where)
        if alter and alter.group(1) not in layout.every_node:
            raise ClusterSqlError(f"{where}: only an ALTER of a sharded table or of a table on every node is "
                                  "generated")
        drop = _DROP_VIEW_RE.match(first)
        if drop:
            return [DROP_VIEW.format(name=drop.group(1), on_cluster=ON_CLUSTER)]
        drop = _DROP_TABLE_RE.match(code)
        if drop:
            return _drop_table(drop.group(1), drop.group(2) or "", layout, where)
        exchange = _EXCHANGE_RE.match(code)
        if exchange:
            return _exchange(exchange.group(1), exchange.group(2), layout, where)
        reload = _RELOAD_RE.match(code)
        if reload:
            return [code + ON_CLUSTER]
        if not alter and not first.startswith("INSERT INTO "):
            raise ClusterSqlError(f"{where}: no cluster form for this statement in {COMMAND}")
        return [code]
    kind, name = create.group(1), create.group(2)
    if kind == "MATERIALIZED VIEW":
        if placement is not None:
            raise ClusterSqlError(f"{where}: a materialized view follows its tables; no `-- @cluster` line")
        return [_materialized_view(create, rest, layout, where)]
    if kind == "DICTIONARY" and placement != "on every node":
        raise ClusterSqlError(f"{where}: a dictionary is made on every node: `-- @cluster on every node`")
    if placement == "on every node":
        layout.every_node.add(name)
        if kind in ("VIEW", "DICTIONARY"):
            return [_on_cluster(create, name) + "\n" + rest]
        return [_replicated(create, name, rest, WHOLE_PATH.format(table=name), WHOLE_REPLICA, where)]
    sharded = re.fullmatch(r"sharded by (.+)", placement or "")
    if sharded is None:
        raise ClusterSqlError(f"{where}: say where its rows live on a cluster, in a comment line right above it: "
                              "`-- @cluster sharded by <expression>` or `-- @cluster on every node`")
    local, key = f"{name}_local", sharded.group(1)
    if kind == "VIEW":
        statements = [_on_cluster(create, local) + "\n" + _localized(rest, layout),
                      DISTRIBUTED_VIEW.format(name=name, on_cluster=ON_CLUSTER, local=local, key=key)]
    else:
        path = EXCHANGED_PATH if name in layout.exchanged else SHARD_PATH.format(table=local)
        statements = [_replicated(create, local, rest, path, SHARD_REPLICA, where),
                      _distributed(name, rest, local, key, where)]
        layout.definitions[name] = rest
    layout.sharded[name] = key
    return statements


def _sharded_alter(alter: re.Match, code: str, where: str) -> list[str]:
    """An ALTER of a sharded table: its _local table ON CLUSTER as written, then the Distributed table's columns
    (ADD COLUMN clauses without codecs; sorting keys and settings belong to the local table only)."""
    name = alter.group(1)
    clauses = [c.strip() for c in code[alter.end():].split(",\n")]
    added = [_CODEC_RE.sub("", c) for c in clauses if c.startswith("ADD COLUMN ")]
    if not all(c.startswith(LOCAL_ALTERS) for c in clauses):
        raise ClusterSqlError(f"{where}: an ALTER of a sharded table may only "
                              f"{', '.join(c.strip() for c in LOCAL_ALTERS)}")
    if not all(_CODEC_ONLY_RE.match(c) for c in clauses if c.startswith("MODIFY COLUMN ")):
        raise ClusterSqlError(f"{where}: a MODIFY COLUMN of a sharded table may only change its codec "
                              "(`MODIFY COLUMN name CODEC(...)`)")
    local = ALTER_LOCAL.format(name=name, on_cluster=ON_CLUSTER) + code[alter.end():]
    if not added:
        return [local]
    return [local, ALTER_DISTRIBUTED.format(name=name, on_cluster=ON_CLUSTER, added=",\n    ".join(added))]


def _drop_table(name: str, sync: str, layout: Layout, where: str) -> list[str]:
    """A sharded table dropped: its Distributed table and its local tables, on every node."""
    if name not in layout.sharded and name not in layout.created:
        raise ClusterSqlError(f"{where}: only a sharded table's drop is generated")
    layout.sharded.pop(name, None)
    return [DROP_TABLE.format(name=table, on_cluster=ON_CLUSTER, sync=sync) for table in (name, f"{name}_local")]


def _exchange(first: str, second: str, layout: Layout, where: str) -> list[str]:
    """A table swapped for the copy this file made of it (`second`): their local tables on every node, then the
    Distributed table in front of the first replaced by one with the copy's columns (atomically: CREATE OR REPLACE)."""
    key = layout.sharded.get(first)
    if key is None or layout.sharded.get(second) != key or second not in layout.definitions:
        raise ClusterSqlError(f"{where}: only an EXCHANGE of a sharded table and its copy made in the same file, "
                              "sharded by one key, is generated")
    return [EXCHANGE.format(first=f"{first}_local", on_cluster=ON_CLUSTER, second=f"{second}_local"),
            _distributed(first, layout.definitions[second], f"{first}_local", key, where,
                         create="CREATE OR REPLACE TABLE")]


def _attach_from(into: str, source: str, layout: Layout, where: str) -> list[str]:
    """A copy made in this file given its table's parts: the rows copied through the Distributed tables."""
    key = layout.sharded.get(source)
    if (key is None or layout.sharded.get(into) != key or into not in layout.definitions
            or not {into, source} <= layout.exchanged):
        raise ClusterSqlError(f"{where}: only an ATTACH PARTITION ALL FROM a sharded table into the copy this file "
                              "makes of it and exchanges it for is generated")
    return [COPY_ROWS.format(into=into, source=source)]


def _on_cluster(create: re.Match, name: str) -> str:
    """The CREATE line of a migration for the object `name`, run ON CLUSTER."""
    return create.string[:create.start(2)] + name + ON_CLUSTER + create.string[create.end(2):]


def _replicated(create: re.Match, table: str, rest: str, path: str, replica: str, where: str) -> str:
    """A MergeTree-family CREATE TABLE as its Replicated form, with the replicated deduplication window."""
    engine = _ENGINE_RE.search(rest)
    if engine is None:
        raise ClusterSqlError(f"{where}: no `ENGINE = …MergeTree` line to replicate")
    head = f"ENGINE = Replicated{engine.group(1)}MergeTree("
    args = [f"'{path}'", f"'{replica}'"]
    line = head + ", ".join([*args, engine.group(2)] if engine.group(2) else args) + ")"
    if len(line) > LINE_LIMIT and engine.group(2):
        line = head + ", ".join(args) + ",\n" + " " * len(head) + engine.group(2) + ")"
    body = _DEDUP_RE.sub("replicated_deduplication_window", rest[:engine.start()] + line + rest[engine.end():])
    return _on_cluster(create, table) + "\n" + body


def _distributed(name: str, rest: str, local: str, key: str, where: str,
                 create: str = "CREATE TABLE IF NOT EXISTS") -> str:
    """The Distributed table in front of `local`: the same columns and types, no codecs (it stores nothing)."""
    lines = rest.splitlines()
    if not lines or lines[0] != "(" or ")" not in lines:
        raise ClusterSqlError(f"{where}: the columns must sit between a line `(` and a line `)`")
    columns = []
    for line in lines[1:lines.index(")")]:
        column = line.strip().removesuffix(",")
        if column and not column.startswith("--"):
            column_name, column_type = column.split(None, 1)
            columns.append((column_name, _CODEC_RE.sub("", column_type)))
    width = max(len(n) for n, _ in columns) + 1
    listed = ",\n".join(f"    {n.ljust(width)}{t}" for n, t in columns)
    return DISTRIBUTED_TABLE.format(create=create, name=name, on_cluster=ON_CLUSTER, columns=listed, local=local,
                                    key=key)


def _materialized_view(create: re.Match, rest: str, layout: Layout, where: str) -> str:
    """A materialized view on every node, from the local window table into the local rollup of each shard."""
    target = _TARGET_RE.match(create.group(3))
    sources = [m.group(3) for m in _REFERENCE_RE.finditer(rest)]
    if target is None or not sources or not all(t in layout.sharded for t in [target.group(1), *sources]):
        raise ClusterSqlError(f"{where}: only a materialized view `TO <table> AS` from sharded tables into a sharded "
                              "table is generated (it runs per shard, on the local tables)")
    return create.string[:create.end(2)] + ON_CLUSTER + f" TO {target.group(1)}_local AS\n" + _localized(rest, layout)


def _localized(text: str, layout: Layout) -> str:
    """`FROM t` / `JOIN t` of a sharded table or view read as its local part on this node."""
    return _REFERENCE_RE.sub(lambda m: f"{m.group(0)}_local" if m.group(3) in layout.sharded else m.group(0), text)


def differences(directory: Path = CLUSTER_DIR, generated: dict[str, str] | None = None) -> list[str]:
    """One line per cluster file in `directory` that is missing, stale or not what the migrations generate."""
    wanted = generated if generated is not None else generate()
    present = {p.name: p.read_text() for p in directory.glob("[0-9][0-9][0-9][0-9]_*.sql")}
    found = [f"{name}: missing" for name in sorted(set(wanted) - set(present))]
    found += [f"{name}: has no migration of that name" for name in sorted(set(present) - set(wanted))]
    found += [f"{name}: differs from what its migration generates" for name in sorted(set(wanted) & set(present))
              if present[name] != wanted[name]]
    return found


def main(argv: list[str] | None = None) -> int:
    """Rewrite sql/cluster/ (or, with --check, only compare); the exit status for the command line."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if sql/cluster differs")
    args = parser.parse_args(argv)
    try:
        generated = generate()
    except ClusterSqlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    found = differences(CLUSTER_DIR, generated)
    if args.check:
        for line in found:
            print(f"sql/cluster/{line}", file=sys.stderr)
        if found:
            print(f"run `{COMMAND}` to regenerate sql/cluster/", file=sys.stderr)
        return 1 if found else 0
    for path in CLUSTER_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql"):
        if path.name not in generated:
            path.unlink()
    for name, text in generated.items():
        path = CLUSTER_DIR / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote sql/cluster/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
