"""The ClickHouse store on chDB: migrations, deduplicated inserts, exact profile queries, locking and threads."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.settings import REPO_ROOT
from fleetprof.store import (
    PARTS_DIR,
    QUERIES_DIR,
    ParamError,
    StoreError,
    UnknownQuery,
    coerce_param,
    migration_files,
    named_queries,
    named_query,
    open_store,
    parse_query,
    parse_time,
    query_file,
    split_statements,
)

FRAME_COLUMNS = ["frame_id", "function", "binary", "kind", "last_seen"]
STACK_COLUMNS = ["stack_id", "frame_ids", "last_seen"]
SAMPLE_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"]
TABLES = {"schema_migrations", "frames", "stacks", "cpu_samples", "gpu_kernel_samples", "gpu_device_metrics",
          "gpu_process_metrics", "alerts", "sink_state"}


def window_start() -> datetime:
    # An hour ago: anything older than the tables' 30-day TTL would be dropped on insert.
    now = datetime.now(tz=UTC).replace(microsecond=0)
    return now - timedelta(hours=1, seconds=now.second % 10)


def node_total(store, node: str) -> int:
    _, rows = store.query_sql("SELECT sum(count) FROM cpu_samples WHERE node = {node:String}", {"node": node})
    return int(rows[0][0])


# --- migrations -----------------------------------------------------------------------------------------------------


def test_migrations_create_every_table_and_are_recorded_once(store):
    _, rows = store.query_sql("SHOW TABLES")
    assert TABLES <= {r[0] for r in rows}
    assert store.migrate() == []
    _, rows = store.query_sql("SELECT version, name FROM schema_migrations FINAL ORDER BY version")
    assert [(v, n) for v, n in rows] == [(v, n) for v, n, _ in migration_files()]


def test_every_migration_statement_can_run_again(store, chdb_dir):
    # A migration stopped midway is run again from its first statement: each file, run twice in a row as the
    # migrations reach it, gives the schema one run gives (IF NOT EXISTS everywhere). Not the whole list again after
    # the last file: an older file's MODIFY ORDER BY would take back a later one's key column.
    import uuid

    from fleetprof.store import open_store

    schema = ("SELECT table, name, type, is_in_sorting_key FROM system.columns WHERE database = currentDatabase() "
              "ORDER BY table, name")
    twice = open_store(f"chdb://{chdb_dir}", f"t_rerun_{uuid.uuid4().hex[:8]}")
    try:
        for _, _, path in migration_files():
            for _ in range(2):
                for statement in split_statements(path.read_text()):
                    twice.client.command(statement)
        assert twice.query_sql(schema)[1] == store.query_sql(schema)[1]
    finally:
        twice.close()


def test_migrations_have_codecs_on_every_column(store):
    # Views (0009), materialized views writing TO a table (0010) and dictionaries (0025) store nothing, so they have no
    # codecs; nor do ALIAS columns (gpu_timeline.end_ns, 0020); every stored column must name one.
    _, rows = store.query_sql(
        "SELECT table, name FROM system.columns WHERE database = currentDatabase() AND compression_codec = ''"
        " AND default_kind != 'ALIAS'"
        " AND table NOT IN (SELECT name FROM system.tables WHERE database = currentDatabase()"
        " AND engine IN ('View', 'MaterializedView', 'Dictionary'))")
    assert rows == []


def test_tables_written_every_flush_merge_with_a_larger_base(store):
    # 0017: every table that gets a part per sink flush (samples, readings, their rollups and tiers, windows) merges
    # with merge_selector_base = 20; the small ones written on change (frames, stacks, process names, identities,
    # alerts, the sink's own state) keep the engine's default.
    _, rows = store.query_sql("SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase() "
                              "AND engine LIKE '%MergeTree'")
    larger = {name for name, ddl in rows if "merge_selector_base = 20" in ddl}
    assert larger == {"cpu_samples", "cpu_samples_1h", "gpu_kernel_samples", "gpu_kernel_samples_1h",
                      "gpu_copy_samples", "gpu_unmatched", "gpu_timeline", "gpu_device_metrics", "gpu_process_metrics",
                      "gpu_device_metrics_10s", "gpu_process_metrics_10s", "profile_windows"}
    assert {name for name, _ in rows} - larger == {"frames", "stacks", "process_names", "workload_identities", "alerts",
                                                   "sink_state", "schema_migrations"}


def test_split_statements_drops_comment_only_pieces():
    text = "-- why\nCREATE TABLE a (x UInt8) ENGINE = Memory;\n\n-- trailing note\nCREATE TABLE b (y UInt8)\n" \
           "ENGINE = Memory;  \n-- done\n"
    assert split_statements(text) == ["-- why\nCREATE TABLE a (x UInt8) ENGINE = Memory",
                                      "-- trailing note\nCREATE TABLE b (y UInt8)\nENGINE = Memory"]


def test_unreachable_server_is_one_line_without_the_password():
    with pytest.raises(StoreError) as caught:
        open_store("http://fleet:s3cret@127.0.0.1:9/", "fleetprof")
    assert "cannot reach ClickHouse at http://127.0.0.1:9/" in str(caught.value)
    assert "s3cret" not in str(caught.value) and "\n" not in str(caught.value)


# --- inserts --------------------------------------------------------------------------------------------------------


def test_insert_with_the_same_dedup_token_counts_once(store):
    ts = window_start()
    rows = [[ts, "dedup", 1, "a", "", 7, 5], [ts, "dedup", 1, "a", "", 8, 2]]
    store.insert("cpu_samples", rows, SAMPLE_COLUMNS, dedup_token="cpu.results:0:100-199:cpu_samples")
    store.insert("cpu_samples", rows, SAMPLE_COLUMNS, dedup_token="cpu.results:0:100-199:cpu_samples")
    assert node_total(store, "dedup") == 7
    store.insert("cpu_samples", rows, SAMPLE_COLUMNS, dedup_token="cpu.results:0:200-299:cpu_samples")
    assert node_total(store, "dedup") == 14


def test_insert_without_token_never_deduplicates(store):
    # The tables keep a deduplication window; without a token an identical block must still count twice.
    ts = window_start()
    rows = [[ts, "plain", 1, "a", "", 7, 5]]
    store.insert("cpu_samples", rows, SAMPLE_COLUMNS)
    store.insert("cpu_samples", rows, SAMPLE_COLUMNS)
    assert node_total(store, "plain") == 10


def test_an_insert_leaves_no_garbage_holding_its_rows(store):
    # clickhouse-connect's InsertContext refers to itself (a bound method it keeps); left as it is, the context and
    # the batch's rows wait for a collection, which the sink's batches pay for (bench/RESULTS.md). After an insert,
    # nothing of it may be left for the collector, in rows or in columns.
    from clickhouse_connect.driver.insert import InsertContext

    ts = int(window_start().timestamp())
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        store.insert("cpu_samples", [[ts, "gc", 1, "a", "", 7, 5]], SAMPLE_COLUMNS)
        store.insert("cpu_samples", [[ts], ["gc"], [2], ["a"], [""], [7], [5]], SAMPLE_COLUMNS, column_oriented=True)
        left = [o for o in gc.get_objects() if isinstance(o, InsertContext)]
    finally:
        if enabled:
            gc.enable()
    assert left == []
    assert node_total(store, "gc") == 10


def test_insert_rejects_a_table_expression(store):
    with pytest.raises(StoreError):
        store.insert("cpu_samples; DROP TABLE frames", [[1]], ["x"])


# --- the profile queries --------------------------------------------------------------------------------------------

# frame id -> (function, binary); 8 is a second address in `run`, 7 the same name in another binary, 9 undefined
FRAMES = {1: ("main", "app"), 2: ("run", "app"), 3: ("compute", "app"), 4: ("memcpy", "libc.so.6"),
          5: ("recurse", "app"), 7: ("compute", "libother.so"), 8: ("run", "app")}
STACKS = {100: [1, 2, 3], 101: [1, 2, 8, 2, 3], 102: [1, 5, 5, 5], 103: [1, 2, 4], 104: [1, 7], 105: [1, 2, 9],
          107: [1, 8, 3]}  # 106 is sampled but has no definition


@pytest.fixture
def profile(store):
    """A hand-built profile with recursion, duplicated definitions, unmerged samples and rows just out of range."""
    t0 = window_start()
    old, new = t0 - timedelta(days=1), t0
    # every definition twice; the older copies of frame 4 and stack 100 say something else, which must not show
    store.insert("frames", [[i, f, b, "NATIVE", new] for i, (f, b) in FRAMES.items()], FRAME_COLUMNS)
    store.insert("frames", [[i, "old_" + f if i == 4 else f, b, "NATIVE", old] for i, (f, b) in FRAMES.items()],
                 FRAME_COLUMNS)
    store.insert("stacks", [[i, ids, new] for i, ids in STACKS.items()], STACK_COLUMNS)
    store.insert("stacks", [[i, [1, 4] if i == 100 else ids, old] for i, ids in STACKS.items()], STACK_COLUMNS)
    s = timedelta(seconds=1)
    samples = [
        (t0, "n1", 10, "train", 100, 5), (t0 + 10 * s, "n1", 10, "train", 101, 3),
        (t0 + 20 * s, "n1", 10, "train", 102, 4), (t0, "n1", 11, "data", 103, 2), (t0, "n1", 11, "data", 100, 1),
        (t0 + 50 * s, "n1", 11, "data", 107, 2),
        (t0, "n2", 10, "train", 104, 6), (t0, "n2", 10, "train", 105, 1), (t0, "n2", 10, "train", 106, 2),
        (t0, "n2", 12, "x", 103, 1),
        (t0 - s, "n1", 10, "train", 100, 100), (t0 + 60 * s, "n1", 10, "train", 100, 100),  # just out of range
    ]
    store.insert("cpu_samples", [[ts, n, p, c, "", st, k] for ts, n, p, c, st, k in samples], SAMPLE_COLUMNS)
    # the same key again in a separate part (a plain MergeTree never folds it, 0023): the queries must sum
    store.insert("cpu_samples", [[t0, "n1", 10, "train", "", 100, 2]], SAMPLE_COLUMNS)
    return store, t0, t0 + 60 * s


def byte_hex(i: int) -> str:
    """ClickHouse's hex(): whole bytes, so an odd digit count gets a leading zero."""
    digits = f"{i:x}"
    return digits.zfill(len(digits) + len(digits) % 2)


def expected(rows: list[tuple[str, int, str, int, int]]) -> tuple[Counter, Counter, Counter]:
    """Reference self/total per (function, binary) and folded stacks, from (node, pid, comm, stack, count)."""
    self_, total, folded = Counter(), Counter(), Counter()
    for _, _, _, stack_id, count in rows:
        if stack_id in STACKS:
            names = [FRAMES.get(i, (f"[unknown 0x{byte_hex(i)}]", "")) for i in STACKS[stack_id]]
        else:
            names = [(f"[unknown stack 0x{byte_hex(stack_id)}]", "")]
        self_[names[-1]] += count
        for name in set(names):
            total[name] += count
        folded[tuple(f for f, _ in names)] += count
    return self_, total, folded


IN_RANGE = [("n1", 10, "train", 100, 7), ("n1", 10, "train", 101, 3), ("n1", 10, "train", 102, 4),
            ("n1", 11, "data", 103, 2), ("n1", 11, "data", 100, 1), ("n1", 11, "data", 107, 2),
            ("n2", 10, "train", 104, 6), ("n2", 10, "train", 105, 1), ("n2", 10, "train", 106, 2),
            ("n2", 12, "x", 103, 1)]


def top(store, since, until, **filters):
    columns, rows = store.query_named("top_functions_cpu", {"since": since, "until": until, "limit": 100, **filters})
    assert columns == ["function", "binary", "self", "total"]
    return rows


def test_top_functions_counts_self_and_total_exactly(profile):
    store, since, until = profile
    rows = top(store, since, until)
    want_self, want_total, _ = expected(IN_RANGE)
    assert {(f, b): s for f, b, s, _ in rows} == {k: want_self[k] for k in want_total}
    assert {(f, b): t for f, b, _, t in rows} == dict(want_total)
    # spelled out: run recurses within stack 101 (three frames, two addresses) and still counts that stack once
    by_name = {(f, b): (s, t) for f, b, s, t in rows}
    assert by_name[("run", "app")] == (0, 7 + 3 + 2 + 1 + 2 + 1 + 1)
    assert by_name[("recurse", "app")] == (4, 4)
    assert by_name[("memcpy", "libc.so.6")] == (3, 3)  # the older "old_memcpy" copy never shows
    assert by_name[("compute", "libother.so")] == (6, 6)  # same name, other binary: its own row
    assert by_name[("[unknown 0x09]", "")] == (1, 1)
    assert by_name[("[unknown stack 0x6a]", "")] == (2, 2)
    assert by_name[("main", "app")] == (0, 27)
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)


def test_top_functions_filters_and_limit(profile):
    store, since, until = profile
    for filters, keep in [({"node": "n2"}, lambda r: r[0] == "n2"), ({"pid": 11}, lambda r: r[1] == 11),
                          ({"comm": "train"}, lambda r: r[2] == "train"),
                          ({"node": "n1", "pid": 10, "comm": "train"}, lambda r: r[:3] == ("n1", 10, "train"))]:
        rows = top(store, since, until, **filters)
        want_self, want_total, _ = expected([r for r in IN_RANGE if keep(r)])
        assert {(f, b): (s, t) for f, b, s, t in rows} == {k: (want_self[k], want_total[k]) for k in want_total}
    _, rows = store.query_named("top_functions_cpu", {"since": since, "until": until, "limit": 2})
    assert [r[0] for r in rows] == ["compute", "compute"]  # app 7+3+2=12 self, then libother.so with 6


def test_flamegraph_and_totals(profile):
    store, since, until = profile
    columns, rows = store.query_named("flamegraph_cpu", {"since": since, "until": until})
    assert columns == ["functions", "count"]
    _, _, want = expected(IN_RANGE)
    assert {tuple(f): c for f, c in rows} == dict(want)
    # stacks 100 and 107 differ in addresses only: one line of 7 + 1 + 2
    assert {tuple(f): c for f, c in rows}[("main", "run", "compute")] == 10
    _, totals = store.query_named("totals_cpu", {"since": since, "until": until})
    assert totals == [("n1", 19), ("n2", 10)]
    _, totals = store.query_named("totals_cpu", {"since": since, "until": until, "comm": "x"})
    assert totals == [("n2", 1)]


def test_named_query_parameters_are_typed_by_placeholders(profile):
    store, since, until = profile
    # text from a URL or a command line is coerced by the placeholder's type
    _, rows = store.query_named("totals_cpu", {"since": since.isoformat(), "until": str(int(until.timestamp())),
                                               "pid": "12"})
    assert rows == [("n2", 1)]
    with pytest.raises(ParamError, match="pid"):
        store.query_named("totals_cpu", {"since": since, "until": until, "pid": "twelve"})
    with pytest.raises(ParamError, match="pid"):
        store.query_named("totals_cpu", {"since": since, "until": until, "pid": "-1"})
    with pytest.raises(ParamError, match="needs parameter since"):
        store.query_named("totals_cpu", {"until": until})
    with pytest.raises(ParamError, match="no parameter bogus"):
        store.query_named("totals_cpu", {"since": since, "until": until, "bogus": 1})
    with pytest.raises(UnknownQuery):
        store.query_named("no_such_query", {})
    with pytest.raises(UnknownQuery):
        store.query_named("../migrations/0001_schema_migrations", {})


WORKLOAD = {"namespace": "String", "pod": "String", "job": "String", "container": "String"}  # filters of 0015
WORKLOAD_DEFAULTS = {"namespace": "", "pod": "", "job": "", "container": ""}


def test_named_queries_declare_their_defaults():
    q = named_query("top_functions_cpu")
    assert q.params == {"since": "DateTime", "until": "DateTime", "node": "String", "pid": "UInt32",
                        "comm": "String", "limit": "UInt32", **WORKLOAD}
    assert q.defaults == {"until": "now", "node": "", "pid": "0", "comm": "", "limit": "20", **WORKLOAD_DEFAULTS}


GPU_DEFAULTS = {"collectives": "all", "what": "all", "nvtx_range": "", "nvtx_level": "0"}


def test_the_flame_graphs_include_the_samples_per_stack_written_once():
    # the merged flame graphs per stack; the UI's (ids) and the exports' (processes) per process and stack
    for name in ("flamegraph_cpu", "flamegraph_ids_cpu", "flamegraph_names_cpu", "flamegraph_processes_cpu",
                 "flamegraph_gpu", "flamegraph_ids_gpu", "flamegraph_names_gpu", "flamegraph_processes_gpu"):
        per = "process_stack" if "_ids_" in name or "_processes_" in name else "stack"
        shared = f"cpu_samples_by_{per}" if name.endswith("cpu") else f"gpu_kernel_samples_by_{per}"
        text = (QUERIES_DIR / f"{name}.sql").read_text()
        # flamegraph_names_gpu adds the names of the frames it makes up (NVTX ranges), not samples
        made_up = 2 if name == "flamegraph_names_gpu" else 0
        assert f"        -- @include {shared}\n" in text and text.count("UNION") == made_up, name
        # the included query's statement, without its comment header, where the line was; the file's own defaults
        statement = named_query(shared).sql.split("\nWITH\n", 1)[1]
        query = named_query(name)
        assert "@include" not in query.sql and textwrap.indent(f"WITH\n{statement}", " " * 8) in query.sql, name
        # the GPU ones also hide or isolate NCCL collectives, pick kernels or copies, and NVTX ranges (0014)
        gpu = {"collectives": "String", "what": "String", "nvtx_range": "String", "nvtx_level": "UInt8"} \
            if name.endswith("gpu") else {}
        assert query.params == {"since": "DateTime", "until": "DateTime", "node": "String", "pid": "UInt32",
                                "comm": "String", **gpu, **WORKLOAD}, name
        assert query.defaults == named_query(shared).defaults == {"until": "now", "node": "", "pid": "0", "comm": "",
                                                                  **(GPU_DEFAULTS if gpu else {}), **WORKLOAD_DEFAULTS}
        assert query_file(QUERIES_DIR / f"{name}.sql").sql == query.sql  # `fleetprof sql --file` reads it alike


def test_an_include_names_a_named_query_and_brings_no_defaults():
    query = parse_query("q", "-- @default limit = 5\nSELECT * FROM\n(\n  -- @include cpu_samples_by_stack\n)\n"
                             "LIMIT {limit:UInt32}")
    assert query.sql.startswith("-- @default limit = 5\nSELECT * FROM\n(\n  WITH\n      -- [first_hour")
    assert list(query.params) == ["since", "until", "node", "namespace", "pod", "job", "container", "pid", "comm",
                                  "limit"]
    assert query.defaults == {"limit": "5"}
    for name in ("no_such_query", "../migrations/0001_schema_migrations"):
        with pytest.raises(UnknownQuery, match="no named query"):
            parse_query("q", f"SELECT * FROM (\n-- @include {name}\n)")


def test_an_include_takes_a_part_of_queries_that_is_no_named_query():
    # sql/parts/ holds filters and joins that several queries share: not statements, so not named queries
    parts = sorted(p.stem for p in PARTS_DIR.glob("*.sql"))
    assert parts and not set(parts) & set(named_queries())
    query = parse_query("q", "SELECT count() FROM gpu_timeline\nWHERE 1\n  -- @include nvtx_range_filter\n")
    assert query.sql.startswith("SELECT count() FROM gpu_timeline\nWHERE 1\n  AND ({nvtx_range:String} = '' OR if(")
    assert "@include" not in query.sql and list(query.params) == ["nvtx_range"] and query.defaults == {}
    # a part may include another part or a named query
    filters = parse_query("q", "-- @include gpu_kernel_filters")
    assert "@include" not in filters.sql and list(filters.params) == ["collectives", "what", "nvtx_range"]
    with pytest.raises(UnknownQuery, match="no named query"):
        named_query("nvtx_range_filter")


def test_parse_time_and_coercion():
    now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    assert parse_time("5m", now) == now - timedelta(minutes=5)
    assert parse_time("2h", now) == now - timedelta(hours=2)
    assert parse_time("7d", now) == now - timedelta(days=7)
    assert parse_time("2025-03-01T10:00:00Z") == datetime(2025, 3, 1, 10, tzinfo=UTC)
    assert parse_time("2025-03-01 10:00:00") == datetime(2025, 3, 1, 10, tzinfo=UTC)  # no zone means UTC
    assert parse_time("2025-03-01T12:00:00+02:00") == datetime(2025, 3, 1, 10, tzinfo=UTC)
    assert parse_time("1740830400") == datetime(2025, 3, 1, 12, tzinfo=UTC)
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")
    assert coerce_param("UInt16", "65535") == 65535
    with pytest.raises(ValueError, match="out of range"):
        coerce_param("UInt16", "65536")
    assert coerce_param("Nullable(Float64)", "1.5") == 1.5
    assert coerce_param("Bool", "true") is True
    assert coerce_param("Array(UInt64)", "[1,2]") == "[1,2]"  # ClickHouse parses the text form itself


# --- ad-hoc SQL -----------------------------------------------------------------------------------------------------


def test_query_sql_is_read_only_by_default(store):
    from clickhouse_connect.driver.exceptions import DatabaseError

    for statement in ["INSERT INTO frames (frame_id) VALUES (1)", "DROP TABLE frames", "CREATE TABLE z (a UInt8) "
                      "ENGINE = Memory", "ALTER TABLE frames DELETE WHERE 1", "SELECT 1 SETTINGS readonly = 0",
                      "OPTIMIZE TABLE cpu_samples FINAL"]:
        with pytest.raises(DatabaseError, match="READONLY"):
            store.query_sql(statement)
    columns, rows = store.query_sql("SELECT {a:UInt8} + 1 AS b", {"a": 41})
    assert (columns, rows) == (["b"], [(42,)])
    # the refusals left no client stuck in read-only mode for the writers
    store.insert("frames", [[1, "f", "b", "NATIVE", window_start()]], FRAME_COLUMNS)
    store.query_sql("OPTIMIZE TABLE frames FINAL", readonly=False)
    assert store.query_sql("SELECT count() FROM frames")[1] == [(1,)]


# --- one process per directory, many threads per process ------------------------------------------------------------

BUSY_CHILD = textwrap.dedent("""
    import sys
    import fleetprof.store as s
    if sys.argv[2] == "skip-precheck":
        # the check before opening misses once, so chDB's own failure has to be recognised afterwards
        real, calls = s._holder, []
        s._holder = lambda path: real(path) if calls.append(1) or len(calls) > 1 else None
    try:
        s.open_store("chdb://" + sys.argv[1], "other")
    except s.StoreBusy as exc:
        print(exc.pid, exc)
        sys.exit(3)
    print("opened")
""")


@pytest.mark.parametrize("mode", ["precheck", "skip-precheck"])
def test_second_process_gets_store_busy(store, chdb_dir, mode):
    done = subprocess.run([sys.executable, "-c", BUSY_CHILD, str(chdb_dir), mode], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    pid, _, message = done.stdout.strip().partition(" ")
    assert int(pid) == os.getpid()
    assert message == f"the chDB store at {os.path.realpath(chdb_dir)} is in use by process {os.getpid()}"
    assert store.query_sql("SELECT 1")[1] == [(1,)]  # the probe did not disturb this process's lock


def test_threads_share_one_store(store):
    t0 = window_start()
    writers, batches, readers = 4, 20, 4
    errors: list[BaseException] = []
    done = threading.Event()
    seen: list[list[int]] = [[] for _ in range(readers)]

    def write(w: int) -> None:
        try:
            for b in range(batches):
                rows = [[t0 + timedelta(seconds=b), "threads", 100 + w, "w", "", 1000 + w, b + 1]]
                for _ in range(2):  # every batch retried: the token makes the retry a no-op
                    store.insert("cpu_samples", rows, SAMPLE_COLUMNS, dedup_token=f"w{w}:b{b}")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def read(r: int) -> None:
        try:
            while not done.is_set():
                _, rows = store.query_named("totals_cpu", {"since": t0, "until": t0 + timedelta(minutes=1),
                                                           "node": "threads"})
                seen[r].append(int(rows[0][1]) if rows else 0)
                store.query_sql("SELECT count() FROM stacks")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(r,)) for r in range(readers)]
    write_threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads + write_threads:
        t.start()
    for t in write_threads:
        t.join()
    done.set()
    for t in threads:
        t.join()
    assert errors == []
    assert node_total(store, "threads") == writers * batches * (batches + 1) // 2
    for values in seen:
        assert values and values == sorted(values)  # each reader saw the total only grow
