"""sql/cluster/ as files: each is what fleetprof.cluster_sql generates from the migration of the same name, every
statement parses, runs on the cluster and places its table as documented. tests/test_cluster_sql.py runs them."""

from __future__ import annotations

import re
import shutil

import pytest

from fleetprof import cluster_sql
from fleetprof.cluster_sql import ClusterSqlError, Layout, differences, generate, generate_file
from fleetprof.store import migration_files, split_statements
from tests.test_cluster_sql import (
    CLUSTER_DIR,
    CREATE_RE,
    ON_CLUSTER_RE,
    REPLICATED_RE,
    cluster_files,
    cluster_statements,
    code,
    sharding,
)

# --- generated from the migrations ----------------------------------------------------------------------------------


def test_sql_cluster_is_what_the_migrations_generate():
    found = differences()
    assert found == [], f"sql/cluster/ is not what sql/migrations/ generates ({'; '.join(found)}): " \
                        f"run `{cluster_sql.COMMAND}`"
    assert cluster_sql.main(["--check"]) == 0


def test_a_drifted_missing_or_stale_cluster_file_is_named(tmp_path):
    for path in cluster_files():
        shutil.copy(path, tmp_path / path.name)
    assert differences(tmp_path) == []
    edited = tmp_path / "0003_cpu_samples.sql"
    edited.write_text(edited.read_text().replace("TTL ts + INTERVAL 30 DAY", "TTL ts + INTERVAL 31 DAY"))
    (tmp_path / "0006_alerts.sql").unlink()
    (tmp_path / "0099_gone.sql").write_text("")
    assert differences(tmp_path) == ["0006_alerts.sql: missing", "0099_gone.sql: has no migration of that name",
                                     "0003_cpu_samples.sql: differs from what its migration generates"]


def test_every_generated_file_says_it_is_generated_and_by_what():
    for name, text in generate().items():
        first = f"-- Generated from sql/migrations/{name} by `python -m fleetprof.cluster_sql`: do not edit."
        assert text.splitlines()[0] == first, name


SHARDED = """-- Rows per key.
--
-- Cluster: why they are sharded so.
-- @cluster sharded by cityHash64(key)
CREATE TABLE IF NOT EXISTS tallies
(
    key   LowCardinality(String) CODEC(ZSTD(1)),
    total UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree(total)
ORDER BY key
SETTINGS non_replicated_deduplication_window = 100;

-- @cluster sharded by cityHash64(key)
CREATE VIEW IF NOT EXISTS tally_totals AS
SELECT key, sum(total) AS total FROM tallies GROUP BY key;

-- @cluster on every node
CREATE VIEW IF NOT EXISTS all_totals AS
SELECT sum(total) AS total FROM tallies
"""

SHARDED_CLUSTER = """\
-- Generated from sql/migrations/0042_tallies.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: why they are sharded so.
CREATE TABLE IF NOT EXISTS tallies_local ON CLUSTER '{cluster}'
(
    key   LowCardinality(String) CODEC(ZSTD(1)),
    total UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/tallies_local', '{replica}', total)
ORDER BY key
SETTINGS replicated_deduplication_window = 100;

CREATE TABLE IF NOT EXISTS tallies ON CLUSTER '{cluster}'
(
    key   LowCardinality(String),
    total UInt64
)
ENGINE = Distributed('{cluster}', currentDatabase(), tallies_local, cityHash64(key));

CREATE VIEW IF NOT EXISTS tally_totals_local ON CLUSTER '{cluster}' AS
SELECT key, sum(total) AS total FROM tallies_local GROUP BY key;

CREATE TABLE IF NOT EXISTS tally_totals ON CLUSTER '{cluster}' AS tally_totals_local
ENGINE = Distributed('{cluster}', currentDatabase(), tally_totals_local, cityHash64(key));

CREATE VIEW IF NOT EXISTS all_totals ON CLUSTER '{cluster}' AS
SELECT sum(total) AS total FROM tallies;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (42, '0042_tallies', now());
"""


def test_a_sharded_table_becomes_a_replicated_local_table_behind_a_distributed_one():
    layout = Layout()
    assert generate_file(42, "0042_tallies", SHARDED, layout) == SHARDED_CLUSTER
    assert layout.sharded == {"tallies": "cityHash64(key)", "tally_totals": "cityHash64(key)"}
    assert layout.every_node == {"all_totals"}


def test_a_sharded_table_s_codecs_change_on_its_local_tables_only():
    # a Distributed table stores nothing: only the local tables take the codec
    migration = SHARDED + ";\nALTER TABLE tallies\n    MODIFY COLUMN total CODEC(Delta, ZSTD(1)),\n" \
                          "    MODIFY COLUMN key CODEC(ZSTD(3))"
    generated = generate_file(42, "0042_tallies", migration, Layout())
    assert ("ALTER TABLE tallies_local ON CLUSTER '{cluster}'\n    MODIFY COLUMN total CODEC(Delta, ZSTD(1)),\n"
            "    MODIFY COLUMN key CODEC(ZSTD(3));") in generated
    assert "ALTER TABLE tallies ON CLUSTER" not in generated


REBUILD = """DROP TABLE IF EXISTS tallies_0042 SYNC;

-- @cluster sharded by cityHash64(key)
CREATE TABLE IF NOT EXISTS tallies_0042
(
    key   String CODEC(ZSTD(1)),
    total UInt64 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree(total)
ORDER BY (cityHash64(key), key);

INSERT INTO tallies_0042 (key, total) SELECT key, total FROM tallies SETTINGS insert_deduplicate = 0;

EXCHANGE TABLES tallies AND tallies_0042;

DROP TABLE IF EXISTS tallies_0042 SYNC;
"""


def test_a_rebuilt_table_is_copied_swapped_and_dropped_on_every_node():
    layout = Layout()
    generate_file(42, "0042_tallies", SHARDED, layout)
    out = generate_file(43, "0043_rebuild", REBUILD, layout)
    guard, *statements = [code(s) for s in split_statements(out)]
    # first, the file stops while a sink batch is unfinished (tests/test_table_rebuilds.py runs it)
    assert guard == code(cluster_sql.REBUILD_GUARD) and "throwIf" in guard
    assert statements[:2] == ["DROP TABLE IF EXISTS tallies_0042 ON CLUSTER '{cluster}' SYNC",
                              "DROP TABLE IF EXISTS tallies_0042_local ON CLUSTER '{cluster}' SYNC"]
    # the copy's path is its UUID's: after the swap the live table has it, and a run again makes a new copy
    assert "ReplicatedSummingMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}', total)" in statements[2]
    assert statements[3].endswith("ENGINE = Distributed('{cluster}', currentDatabase(), tallies_0042_local, "
                                  "cityHash64(key))")
    assert statements[4].startswith("INSERT INTO tallies_0042 (key, total) SELECT key, total FROM tallies")
    assert statements[5] == "EXCHANGE TABLES tallies_local AND tallies_0042_local ON CLUSTER '{cluster}'"
    # the Distributed table takes the copy's columns, still in front of tallies_local
    assert statements[6] == statements[3].replace("CREATE TABLE IF NOT EXISTS tallies_0042 ",
                                                  "CREATE OR REPLACE TABLE tallies ").replace("tallies_0042_local",
                                                                                              "tallies_local")
    assert statements[7:9] == statements[:2]
    assert "tallies_0042" not in layout.sharded and layout.sharded["tallies"] == "cityHash64(key)"


def test_a_copy_given_its_table_s_parts_on_one_node_gets_the_rows_copied_on_a_cluster():
    """ATTACH PARTITION ... FROM acts on one replica's parts, so ON CLUSTER every replica of a shard would attach its
    own (and a lagging one less): the cluster form copies the rows through the Distributed tables instead."""
    layout = Layout()
    generate_file(42, "0042_tallies", SHARDED, layout)
    attaching = REBUILD.replace("INSERT INTO tallies_0042 (key, total) SELECT key, total FROM tallies SETTINGS "
                                "insert_deduplicate = 0", "ALTER TABLE tallies_0042 ATTACH PARTITION ALL FROM tallies")
    statements = [code(s) for s in split_statements(generate_file(43, "0043_rebuild", attaching, layout))]
    assert statements[5] == ("INSERT INTO tallies_0042 SELECT * FROM tallies\n"
                             "SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1")
    assert not any("ATTACH" in s for s in statements)


@pytest.mark.parametrize(("migration", "message"), [
    (SHARDED + ";\nALTER TABLE tallies ATTACH PARTITION ALL FROM tally_totals",
     "only an ATTACH PARTITION ALL FROM a sharded table into the copy this file makes of it and exchanges it for"),
    (SHARDED.replace("-- @cluster sharded by cityHash64(key)\nCREATE TABLE", "CREATE TABLE"),
     "0042_tallies.sql: CREATE TABLE IF NOT EXISTS tallies: say where its rows live on a cluster"),
    (SHARDED.replace("-- @cluster on every node\n", "-- @cluster on every node\n-- @cluster on every node\n"),
     "0042_tallies.sql: CREATE VIEW IF NOT EXISTS all_totals AS: two `-- @cluster` lines"),
    (SHARDED + ";\n-- @cluster on every node\n", "a `-- @cluster` line belongs in the comment lines right above"),
    (SHARDED + ";\nALTER TABLE tallies DROP COLUMN total",
     "ALTER TABLE tallies DROP COLUMN total: an ALTER of a sharded table may only ADD COLUMN, MODIFY "
     "ORDER BY, MODIFY SETTING, MODIFY TTL, MODIFY COLUMN"),
    (SHARDED + ";\nALTER TABLE tallies MODIFY COLUMN total UInt32",
     "ALTER TABLE tallies MODIFY COLUMN total UInt32: a MODIFY COLUMN of a sharded table may only change its codec"),
    (SHARDED + ";\nALTER TABLE tallies MODIFY COLUMN total UInt32 CODEC(ZSTD(1))",
     "a MODIFY COLUMN of a sharded table may only change its codec"),
    (SHARDED + ";\n-- @cluster on every node\nINSERT INTO tallies SELECT 'a', 1",
     "`-- @cluster` places a table or a view, nothing else"),
    (SHARDED + ";\nCREATE MATERIALIZED VIEW IF NOT EXISTS mv TO tallies AS SELECT 'a' AS key, 1 AS total FROM t",
     "only a materialized view `TO <table> AS` from sharded tables into a sharded table"),
    (SHARDED + ";\nDROP TABLE tallies", "DROP TABLE tallies: no cluster form for this statement"),
    (SHARDED + ";\nDROP TABLE IF EXISTS all_totals",
     "DROP TABLE IF EXISTS all_totals: only a sharded table's drop is generated"),
    (SHARDED + ";\nEXCHANGE TABLES tallies AND all_totals",
     "EXCHANGE TABLES tallies AND all_totals: only an EXCHANGE of a sharded table and its copy made in the same file"),
    (SHARDED + ";\nEXCHANGE TABLES tallies AND tally_totals", "only an EXCHANGE of a sharded table and its copy"),
])
def test_what_the_generator_cannot_place_is_refused_with_the_statement_named(migration, message):
    with pytest.raises(ClusterSqlError, match=re.escape(message)):
        generate_file(42, "0042_tallies", migration, Layout())


# --- the statements -------------------------------------------------------------------------------------------------


def test_every_migration_has_a_cluster_variant_of_the_same_name():
    assert [p.name for p in cluster_files()] == [path.name for _, _, path in migration_files()]


def test_every_statement_parses(store):
    statements = cluster_statements()
    assert len(statements) >= 30
    for name, statement in statements:
        try:
            store.query_sql("SELECT formatQuery({sql:String})", {"sql": statement})
        except Exception as exc:  # the message names the file and the statement that does not parse
            pytest.fail(f"{name}: {statement[:80]!r} does not parse: {exc}")


def test_a_statement_that_does_not_parse_is_caught(store):
    broken = "CREATE TABLE IF NOT EXISTS x ON CLUSTER '{cluster}' (a UInt64 ENGINE = Distributed('{cluster}')"
    with pytest.raises(Exception, match="Syntax error"):
        store.query_sql("SELECT formatQuery({sql:String})", {"sql": broken})


def test_creates_run_on_the_cluster_and_each_replicated_table_has_its_own_keeper_path(store):
    paths = {}
    for name, statement in cluster_statements():
        if statement.startswith("CREATE"):
            _, rows = store.query_sql("SELECT formatQuery({sql:String})", {"sql": statement})
            assert " ON CLUSTER `{cluster}`" in rows[0][0].splitlines()[0], f"{name}: {statement[:60]!r}"
        for table, (_, path, replica) in _replicated(statement).items():
            if path == "/clickhouse/tables/{uuid}/{shard}":
                # a rebuilt table's copy (0019-0023): swapped in under the live name, so its path is its own UUID's
                assert table in ("cpu_samples_0019_local", "gpu_kernel_samples_0019_local", "gpu_timeline_0020_local",
                                 "gpu_timeline_0021_local", "gpu_device_metrics_0022_local",
                                 "gpu_process_metrics_0022_local", "cpu_samples_0023_local",
                                 "gpu_kernel_samples_0023_local", "cpu_samples_0025_local",
                                 "gpu_kernel_samples_0025_local", "cpu_samples_1h_0025_local",
                                 "gpu_kernel_samples_1h_0025_local"), table
                assert replica == "{replica}", (table, replica)
                continue
            whole = path == f"/clickhouse/tables/all/{{database}}/{table}"
            # a table on every node is one replica set: its replicas need names unique across the cluster
            assert whole or path == f"/clickhouse/tables/{{shard}}/{{database}}/{table}", (table, path)
            assert replica == ("{shard}-{replica}" if whole else "{replica}"), (table, replica)
            assert whole == (table in ("frames", "schema_migrations", "sink_state", "process_names")), table
            assert path not in paths, f"{table} and {paths.get(path)} share {path}"
            paths[path] = table
    assert len(paths) == 19  # process_names (0025) the last


def _replicated(statement: str) -> dict[str, tuple[str, str, str]]:
    create = CREATE_RE.match(statement)
    engine = REPLICATED_RE.search(statement)
    return {create.group(2): engine.groups()} if create and engine else {}


def test_distributed_tables_front_their_local_tables_with_the_documented_keys():
    # stacks and their samples share a key, so a stack's definition and its samples share a shard; alerts must keep
    # every row of one alert on one shard for FINAL; the NVML tables keep a node together
    assert sharding() == {
        "stacks": ("stacks_local", "stack_id"),
        "cpu_samples": ("cpu_samples_local", "stack_id"),
        "gpu_kernel_samples": ("gpu_kernel_samples_local", "stack_id"),
        "gpu_device_metrics": ("gpu_device_metrics_local", "cityHash64(node)"),
        "gpu_process_metrics": ("gpu_process_metrics_local", "cityHash64(node)"),
        "alerts": ("alerts_local", "cityHash64(alert_id)"),
        "gpu_unmatched": ("gpu_unmatched_local", "cityHash64(node)"),
        "profile_windows": ("profile_windows_local", "cityHash64(node)"),
        # copies are rows of gpu_kernel_samples with their bytes (0014); the timeline keeps a node together
        "gpu_copy_samples": ("gpu_copy_samples_local", "stack_id"),
        "gpu_timeline": ("gpu_timeline_local", "cityHash64(node)"),
        # the workload identity dimension table (0015), like stacks: by its key
        "workload_identities": ("workload_identities_local", "cityHash64(identity)"),
        # the hourly rollups sit with the window rows they sum
        "cpu_samples_1h": ("cpu_samples_1h_local", "stack_id"),
        "gpu_kernel_samples_1h": ("gpu_kernel_samples_1h_local", "stack_id"),
        # the NVML 10 s aggregates (0016) sit with the 1 s readings they sum
        "gpu_device_metrics_10s": ("gpu_device_metrics_10s_local", "cityHash64(node)"),
        "gpu_process_metrics_10s": ("gpu_process_metrics_10s_local", "cityHash64(node)"),
        # the stack views run on the shards, each over its own stacks, behind Distributed tables of the same names
        "stack_frames": ("stack_frames_local", "stack_id"),
        "stack_frame_names": ("stack_frame_names_local", "stack_id"),
        "stack_names": ("stack_names_local", "stack_id"),
    }


def single_node_creates(kind: str) -> list[str]:
    """Every `CREATE <kind>` of sql/migrations, without comment lines, in order."""
    return [code(s) for _, _, path in migration_files() for s in split_statements(path.read_text())
            if code(s).startswith(f"CREATE {kind} ")]


def localized(statement: str, names: set[str]) -> str:
    """A statement reading the `_local` table or view of each of `names`."""
    return re.sub(r"\b(" + "|".join(sorted(names)) + r")\b", lambda m: f"{m.group(1)}_local", statement)


def test_views_are_the_single_node_views_over_the_local_tables():
    # a view per shard reads the local tables and views of its shard; a view on every node (frame_names) is the
    # single node's, reading what it reads there
    per_shard = {table for table, (local, _) in sharding().items() if local == f"{table}_local"}
    single = [localized(s, per_shard) if CREATE_RE.match(s).group(2) in per_shard else s
              for s in single_node_creates("VIEW")]
    cluster = [ON_CLUSTER_RE.sub("", s) for _, s in cluster_statements() if s.startswith("CREATE VIEW")]
    assert len(cluster) >= 4
    assert cluster == single


def test_materialized_views_are_the_single_node_ones_over_the_local_tables():
    # each shard sums the blocks it receives into its own rollup: the view reads and writes the _local tables
    local = {"cpu_samples", "gpu_kernel_samples", "cpu_samples_1h", "gpu_kernel_samples_1h", "gpu_device_metrics",
             "gpu_process_metrics", "gpu_device_metrics_10s", "gpu_process_metrics_10s"}
    single = [localized(s, local) for s in single_node_creates("MATERIALIZED VIEW")]
    cluster = [ON_CLUSTER_RE.sub("", s) for _, s in cluster_statements() if s.startswith("CREATE MATERIALIZED VIEW")]
    # 0014 recreates gpu_kernel_samples_1h_mv with nvtx_range, 0015 both with identity; 0016 adds the NVML 10 s views;
    # 0018 recreates both hourly views without their grouping, 0019 and 0023 on the rebuilt tables, 0022 the NVML views
    # on theirs, 0024 the NVML views writing the newest reading as a tuple, 0025 both hourly views over process ids
    assert len(cluster) == 19
    assert cluster == single


def test_every_cluster_file_records_its_own_version():
    assert CLUSTER_DIR.is_dir()
    for path in cluster_files():
        last = code(split_statements(path.read_text())[-1])
        version = int(path.name[:4])
        assert last == (f"INSERT INTO schema_migrations (version, name, applied_at) "
                        f"VALUES ({version}, '{path.stem}', now())"), path.name
