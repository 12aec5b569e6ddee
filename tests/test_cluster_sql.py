"""sql/cluster/, the ClickHouse cluster schema, built as a two-shard layout: every single-node table and view has a
cluster counterpart with the same columns, codecs, engine, keys and TTL, and every named query gives the same answer
on it as on one node. tests/test_cluster_sql_files.py checks the files themselves, with the helpers defined here.

Replicated tables need Keeper and ON CLUSTER needs a server's DDL worker, neither of which chDB runs, so the layout is
built in one chDB process (a child, since chDB reads its configuration once per process) as follows:
  * the statements run without ON CLUSTER, and each Replicated*MergeTree('path', 'replica', args) becomes
    *MergeTree(args): the same engine without replication;
  * the cluster `fleet` has two shards, both this process (a shard is "local" when its port is the configured
    tcp_port or tcp_port_secure; chDB listens on neither), so each Distributed table sends every shard's part of a
    query to the same `<name>_local` table, in process;
  * a row policy on each `<name>_local` table, `<sharding key> % 2 = shardNum() - 1`, makes each shard see exactly the
    rows that the Distributed table sends to it on insert (the key modulo the total weight picks the shard), so every
    shard holds its own slice, as on a real cluster; tables on every node (frames, sink_state, schema_migrations)
    get no policy; outside a Distributed read (shardNum() = 0: a materialized view reading the inserted block) the
    policy shows every row;
  * the users' settings are sql/cluster/fleetprof-profiles.xml itself, dropped into users.d/ as on a server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from fleetprof.cluster_sql import CLUSTER_DIR
from fleetprof.store import migration_files, split_statements
from processors.sink import IDENTITY_COLUMNS

PROFILES = CLUSTER_DIR / "fleetprof-profiles.xml"
CLUSTER = "fleet"
SINGLE_DB = "single"
CLUSTER_DB = "sharded"
SHARDS = 2

ON_CLUSTER_RE = re.compile(r"\s+ON CLUSTER '\{cluster\}'")
REPLICATED_RE = re.compile(r"Replicated(\w*MergeTree)\(\s*'([^']*)',\s*'([^']*)'\s*(?:,\s*)?")
DISTRIBUTED_RE = re.compile(
    r"CREATE TABLE IF NOT EXISTS (\w+) ON CLUSTER '\{cluster\}'.*"
    r"ENGINE = Distributed\('\{cluster\}', currentDatabase\(\), (\w+), (.+)\)$", re.S)
CREATE_RE = re.compile(r"^CREATE (TABLE|VIEW) IF NOT EXISTS (\w+)")
DROP_TABLE_RE = re.compile(r"^DROP TABLE IF EXISTS (\w+) ON CLUSTER")
COMMENT_LINE_RE = re.compile(r"^\s*--.*\n?", re.M)


def cluster_files() -> list[Path]:
    return sorted(CLUSTER_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql"))


def code(statement: str) -> str:
    """A statement without its whole-line comments."""
    return COMMENT_LINE_RE.sub("", statement).strip()


def cluster_statements() -> list[tuple[str, str]]:
    """(file name, statement without comment lines) for every statement of sql/cluster, in order."""
    return [(path.name, code(s)) for path in cluster_files() for s in split_statements(path.read_text())]


def sharding() -> dict[str, tuple[str, str]]:
    """Distributed table -> (the local table or view it fronts, its sharding key expression), from the cluster SQL."""
    found = {}
    for _, statement in cluster_statements():
        match = DISTRIBUTED_RE.match(statement)
        if match:
            found[match.group(1)] = (match.group(2), match.group(3))
        dropped = DROP_TABLE_RE.match(statement)
        if dropped:  # a rebuilt table's copy (0019) is gone by the end
            found.pop(dropped.group(1), None)
    return found


def stored() -> dict[str, tuple[str, str]]:
    """The Distributed tables in front of local tables that store rows (not views), as sharding() gives them."""
    views = {m.group(2) for _, s in cluster_statements() if (m := CREATE_RE.match(s)) and m.group(1) == "VIEW"}
    return {table: target for table, target in sharding().items() if target[0] not in views}


def single_node_form(statement: str) -> str:
    """A cluster statement as chDB can run it in one process: no ON CLUSTER, and no replication in the engines."""
    return REPLICATED_RE.sub(lambda m: f"{m.group(1)}(", ON_CLUSTER_RE.sub("", statement))


# --- the two-shard layout, built in a child process -----------------------------------------------------------------


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What the child reports after building both databases, loading the same rows and running every query."""
    workdir = tmp_path_factory.mktemp("cluster")
    done = subprocess.run([sys.executable, __file__, str(workdir)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    report = workdir / "report.json"
    if not report.exists():
        pytest.fail(f"the cluster layout did not build (exit {done.returncode}): {done.stderr[-3000:]}")
    return json.loads(report.read_text())


def test_each_shard_holds_its_own_slice_of_every_sharded_table(layout):
    for table, counts in layout["placement"].items():
        assert all(counts["per_shard"][str(s)] > 0 for s in range(1, SHARDS + 1)), (table, counts)
        assert sum(counts["per_shard"].values()) == counts["single"], (table, counts)


def test_a_stack_and_its_samples_share_a_shard(layout):
    assert layout["colocation"] == {"cpu_samples": 0, "gpu_kernel_samples": 0, "gpu_copy_samples": 0}


def test_tables_and_views_match_the_single_node_schema(layout):
    assert layout["columns"]["missing"] == []
    assert layout["columns"]["different"] == {}
    assert layout["engines"]["different"] == {}
    assert layout["engines"]["checked"] >= 10


def test_migrate_finds_every_migration_applied_on_the_cluster(layout):
    assert layout["migrate_on_cluster"] == []
    assert layout["applied_versions"] == [v for v, _, _ in migration_files()]


def test_every_named_query_answers_the_same_on_two_shards(layout):
    results = layout["queries"]
    assert len(results) >= 28
    for case, result in results.items():
        assert result["error"] is None, f"{case}: {result['error']}"
        assert result["single"], f"{case} returns no rows on the known data: the comparison would prove nothing"
        assert result["sharded"] == result["single"], case


def test_known_totals_on_two_shards(layout):
    # the exact numbers, not only the agreement of both layouts: CPU samples and GPU ns per node
    assert layout["queries"]["totals_cpu"]["sharded"] == ["('n1', 12)", "('n2', 2)", "('n3', 4)"]
    assert layout["queries"]["totals_gpu"]["sharded"] == ["('n1', 9500, 10)", "('n3', 7300, 8)"]
    assert layout["queries"]["totals_gpu[what=copies]"]["sharded"] == ["('n1', 500, 1)", "('n3', 300, 1)"]
    assert layout["queries"]["gpu_copy_bytes_by_stack"]["sharded"] == [
        f"('main;launch', 13500, 13000, 500, 4096, 4096, 0, 0, 1, {4096 / (500 / 1e9)!r})",
        f"('main;run;launch', 3300, 3000, 300, 1024, 1024, 0, 0, 1, {1024 / (300 / 1e9)!r})"]


def test_queries_need_the_profiles_global_product_mode(layout):
    # ClickHouse's default, deny, refuses the IN subqueries on the views; local reads each shard's own samples in
    # the subquery, which misses a process whose CPU samples sit on another shard than its GPU samples
    assert "flamegraph_cpu" in layout["deny_refused"]
    assert layout["local_mode"]["top_kernels_gpu[comm=train]"]["sharded"] != \
        layout["queries"]["top_kernels_gpu[comm=train]"]["single"]


# --- the child ------------------------------------------------------------------------------------------------------

CONFIG = """<clickhouse>
  <tcp_port>9000</tcp_port>
  <tcp_port_secure>9440</tcp_port_secure>
  <users_config>{users}</users_config>
  <macros><cluster>{cluster}</cluster><shard>01</shard><replica>r1</replica></macros>
  <remote_servers>
    <{cluster}>
      <shard><replica><host>localhost</host><port>9000</port></replica></shard>
      <shard><replica><host>localhost</host><port>9440</port><secure>1</secure></replica></shard>
    </{cluster}>
  </remote_servers>
</clickhouse>
"""

USERS = """<clickhouse>
  <users>
    <default>
      <password></password>
      <networks><ip>::1</ip><ip>127.0.0.1</ip></networks>
      <profile>fleetprof_sink</profile>
      <quota>default</quota>
      <databases><{database}>{filters}</{database}></databases>
    </default>
  </users>
  <profiles><default/></profiles>
  <quotas><default/></quotas>
</clickhouse>
"""


def write_config(workdir: Path) -> Path:
    """config.xml with the two-shard cluster, users.xml with the shards' row policies, users.d with the profiles."""
    # shardNum() is 0 outside a Distributed table's read: a materialized view reading the block just inserted into a
    # _local table (0010) must see all of it, as on a real cluster, where no policy exists
    filters = "".join(f"<{local}><filter>shardNum() = 0 OR {escape(key)} % {SHARDS} = shardNum() - 1</filter></{local}>"
                      for local, key in stored().values())
    users = workdir / "users.xml"
    users.write_text(USERS.format(database=CLUSTER_DB, filters=filters))
    (workdir / "users.d").mkdir()
    shutil.copy(PROFILES, workdir / "users.d" / PROFILES.name)
    config = workdir / "config.xml"
    config.write_text(CONFIG.format(users=users, cluster=CLUSTER))
    return config


ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"  # an NCCL collective
ALL_REDUCE_MANGLED = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"


def known_rows(base: datetime) -> dict[str, tuple[list[str], list[list]]]:
    """The same rows for both layouts: three nodes (n1 and n2 hash to shard 1, n3 to shard 2), stacks with even and
    odd ids (shards 1 and 2), a stack defined twice, a sampled stack without definition and a frame without one."""
    t = [base + timedelta(seconds=10 * i) for i in range(6)]
    kinds = ["NATIVE"] * 6 + ["GPU_KERNEL", "GPU_KERNEL", "GPU_KERNEL"]
    names = ["main", "run", "compute", "io", "idle", "launch", "gemm", ALL_REDUCE, "[memcpy HtoD]"]
    frames = [[i + 1, name, "app" if i != 3 else "libc.so.6", kind, t[0], "" if i > 5 else f"{i:02x}" * 20]
              for i, (name, kind) in enumerate(zip(names, kinds, strict=True))]
    stacks = [[100, [1, 2, 3], t[0]], [101, [1, 2, 2, 4], t[0]], [102, [1, 5], t[0]], [103, [1, 6, 7], t[0]],
              [104, [1, 2, 6, 8], t[0]], [105, [1, 99], t[0]], [105, [1, 2, 99], t[1]], [107, [1, 6, 9], t[0]],
              [108, [1, 2, 6, 9], t[0]]]
    ident = {"n1": f"{1:016x}", "n2": "", "n3": f"{2:016x}"}  # 0015: n1's process is pod ml/a of Job 7
    cpu = [[t[0], "n1", 10, "train", "", 100, 5], [t[0], "n1", 10, "train", "", 100, 1],
           [t[1], "n1", 10, "train", "", 101, 3], [t[2], "n1", 10, "train", "", 105, 2],
           [t[3], "n1", 10, "train", "", 106, 1], [t[2], "n2", 20, "serve", "", 102, 2],
           [t[1], "n3", 30, "train", "", 102, 4]]
    cpu = [[*row, ident[row[1]]] for row in cpu]
    # copies and sets are GPU time too (0014), each also a row of gpu_copy_samples with its bytes
    gpu = [[t[1], "n1", 10, "", "", 0, 7, 103, "gemm", 6000, 6, "step > forward"],
           [t[2], "n1", 10, "", "", 0, 7, 104, ALL_REDUCE_MANGLED, 3000, 3, "step > backward"],
           [t[1], "n3", 30, "", "", 0, 7, 103, "gemm", 7000, 7, ""],
           [t[1], "n1", 10, "", "", 0, 7, 107, "[memcpy HtoD]", 500, 1, "step > forward"],
           [t[2], "n3", 30, "", "", 0, 7, 108, "[memcpy HtoD]", 300, 1, ""]]
    gpu = [[*row, ident[row[1]]] for row in gpu]
    copies = [[t[1], "n1", 10, "", "", 0, 7, 107, "[memcpy HtoD]", "pinned>device", "step > forward", 500, 4096, 1],
              [t[2], "n3", 30, "", "", 0, 7, 108, "[memcpy HtoD]", "pageable>device", "", 300, 1024, 1]]
    start = int(t[1].timestamp()) * 10**9
    timeline = [[t[1], "n1", 10, "", 0, 7, start + 5, 500, "MEMCPY", "[memcpy HtoD]", 107, 1, 4096,
                 "step > forward", 0, 0, 41],
                [t[1], "n1", 10, "", 0, 7, start + 1000, 1000, "KERNEL", "gemm", 103, 6, 0, "step > forward",
                 3, 17, 42],
                [t[1], "n3", 30, "", 0, 7, start + 10, 1000, "KERNEL", "gemm", 103, 7, 0, "", 0, 0, 43]]
    device = []
    for i, when in enumerate(t):
        for node, util in (("n1", [90, 80, 5, 3, 85, 90][i]), ("n3", [50, 4, 2, 60, 70, 80][i])):
            device.append([when + timedelta(seconds=1), node, 0, f"GPU-{node}", "H100", "", util, util // 2,
                           8 << 30, 80 << 30, 1500, 2600, 300_000 + 1000 * util, 700_000, 60, 100, 200, 0, [], False])
    device.append([t[0] + timedelta(seconds=1), "n2", 0, "GPU-n2", "H100", "", None, None, None, 80 << 30, None, None,
                   None, 700_000, None, None, None, None, [79], True])
    device = [[*row, ident[row[1]] if row[1] == "n1" else ""] for row in device]  # n3's GPU: held by no pod
    process = [[t[i] + timedelta(seconds=1), node, 0, pid, "train", "", 40, 10, 1 << 30, False, ident[node]]
               for i in range(6) for node, pid in (("n1", 10), ("n3", 30))]
    alerts = [["a-n1-1", "gpu_util_drop", "FIRING", "n1", 0, "GPU-n1", t[2], t[2], 20.0, 5.0, "drop", "[]"],
              ["a-n1-1", "gpu_util_drop", "FIRING", "n1", 0, "GPU-n1", t[2], t[2] + timedelta(seconds=1), 20.0, 5.0,
               "drop again", "[]"],
              ["a-n1-1", "gpu_util_drop", "RESOLVED", "n1", 0, "GPU-n1", t[2], t[4], 20.0, 85.0, "back", "[]"],
              ["a-n3-2", "gpu_util_drop", "FIRING", "n3", 0, "GPU-n3", t[1], t[1], 20.0, 4.0, "drop", "[]"]]
    unmatched = [[t[0], "n1", 10, "LAUNCH", "EXPIRED", 2, 0, 2], [t[0], "n3", 30, "KERNEL", "LATE", 1, 500, 0]]
    windows = [[t[0], "n1", "cpu", False, 19], [t[1], "n1", "cpu", False, 19], [t[2], "n2", "cpu", True, 99],
               [t[1], "n3", "cpu", False, 19], [t[1], "n1", "gpu", False, 0], [t[1], "n3", "gpu", True, 0]]
    identities = [[f"{i:016x}", "n1" if i % 2 else "n3", t[0], "pod", "containerd", f"{i:02x}" * 32, "main",
                   "a" if i == 1 else f"train-{i}", "ml", f"uid-{i}",
                   {"team": "vision", **({"job-name": "7"} if i == 1 else {})}, "", "", "", "", "", "", "", "vision",
                   False] for i in range(1, 7)]
    state = [["gpu.samples", 0, 0, 9, "BEFORE", t[0]], ["gpu.samples", 0, 0, 9, "AFTER", t[0] + timedelta(seconds=1)],
             ["gpu.samples", 1, 10, 19, "BEFORE", t[1]]]
    return {
        "frames": (["frame_id", "function", "binary", "kind", "last_seen", "build_id"], frames),
        "stacks": (["stack_id", "frame_ids", "last_seen"], stacks),
        "cpu_samples": (["ts", "node", "pid", "comm", "container_id", "stack_id", "count", "identity"], cpu),
        "gpu_kernel_samples": (["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id",
                                "kernel_name", "duration_ns", "launches", "nvtx_range", "identity"], gpu),
        "gpu_copy_samples": (["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id",
                              "kernel_name", "memory_kinds", "nvtx_range", "duration_ns", "bytes", "launches"], copies),
        "gpu_timeline": (["ts", "node", "pid", "comm", "device", "stream", "start_ns", "duration_ns", "activity",
                          "name", "stack_id", "weight", "bytes", "nvtx_range", "graph_id", "graph_node_id",
                          "correlation_id"], timeline),
        "gpu_device_metrics": (["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct",
                                "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz",
                                "power_mw", "power_limit_mw", "temperature_c", "pcie_tx_kbps", "pcie_rx_kbps",
                                "clock_event_reasons", "xid_errors", "simulated", "identity"], device),
        "gpu_process_metrics": (["ts", "node", "gpu_index", "pid", "comm", "container_id", "sm_util_pct",
                                 "mem_util_pct", "used_memory_bytes", "simulated", "identity"], process),
        "alerts": (["alert_id", "kind", "state", "node", "gpu_index", "gpu_uuid", "started", "time", "threshold",
                    "observed", "message", "evidence"], alerts),
        "gpu_unmatched": (["ts", "node", "pid", "side", "reason", "events", "duration_ns", "launches"], unmatched),
        "sink_state": (["topic", "partition", "min_offset", "max_offset", "state", "updated"], state),
        "profile_windows": (["ts", "node", "kind", "simulated", "frequency_hz"], windows),
        # workload identities (0015): the dimension table, sharded by the id's key
        "workload_identities": (IDENTITY_COLUMNS, identities),
    }


def query_cases(base: datetime) -> dict[str, tuple[str, dict]]:
    """Every named query with values for its parameters that have no default, plus a few filtered variants."""
    from fleetprof.store import named_queries, named_query

    values = {"since": base - timedelta(minutes=1), "until": base + timedelta(minutes=5), "node": "n1", "pids": [10],
              "step_ms": 10_000, "topic": "gpu.samples", "binaries": ["app", "libc.so.6", "nosuch"]}
    cases = {}
    for name in named_queries():
        query = named_query(name)
        missing = [p for p in query.params if p not in query.defaults and p not in values]
        if missing:
            raise SystemExit(f"give the cluster test a value for {name}'s parameters {missing}")
        cases[name] = (name, {p: values[p] for p in query.params if p not in query.defaults or p in ("since", "until")})
    for name in ("top_kernels_gpu", "flamegraph_gpu", "totals_gpu", "top_functions_cpu"):
        cases[f"{name}[comm=train]"] = (name, {**cases[name][1], "comm": "train"})
    for name in ("top_kernels_gpu", "flamegraph_ids_gpu", "totals_gpu"):
        for collectives in ("hide", "only"):
            cases[f"{name}[collectives={collectives}]"] = (name, {**cases[name][1], "collectives": collectives})
    # copies, kernels and NVTX ranges (0014): the filters and the flame graphs' range level, rollup and windows
    for name in ("top_kernels_gpu", "totals_gpu", "flamegraph_gpu", "flamegraph_ids_gpu"):
        for what in ("kernels", "copies"):
            cases[f"{name}[what={what}]"] = (name, {**cases[name][1], "what": what})
        cases[f"{name}[nvtx_range=forward]"] = (name, {**cases[name][1], "nvtx_range": "forward"})
    for name in ("flamegraph_gpu", "flamegraph_ids_gpu", "flamegraph_names_gpu", "flamegraph_processes_gpu"):
        cases[f"{name}[nvtx_level=1]"] = (name, {**cases[name][1], "nvtx_level": 1})
    for name in ("gpu_copy_bytes_by_stack", "gpu_time_by_nvtx_range", "gpu_time_by_nvtx_element"):
        cases[f"{name}[nvtx_range=step]"] = (name, {**cases[name][1], "nvtx_range": "step"})
    cases["alerts[node=n1]"] = ("alerts", {**cases["alerts"][1], "node": "n1"})
    # ranges holding whole hours: the flame graphs read those from the hourly rollups (0010), the edges from windows
    hours = {"since": base - timedelta(minutes=150), "until": base + timedelta(minutes=95)}
    for name in ("flamegraph_cpu", "flamegraph_ids_cpu", "flamegraph_names_cpu", "flamegraph_gpu", "flamegraph_ids_gpu",
                 "flamegraph_names_gpu"):
        cases[f"{name}[hours]"] = (name, {**cases[name][1], **hours})
    cases["flamegraph_gpu[hours,comm=train]"] = ("flamegraph_gpu", {**cases["flamegraph_gpu"][1], **hours,
                                                                    "comm": "train"})
    for name in ("flamegraph_ids_gpu", "flamegraph_names_gpu", "flamegraph_processes_gpu"):
        cases[f"{name}[hours,nvtx_level=1,nvtx_range=step]"] = (name, {**cases[name][1], **hours, "nvtx_level": 1,
                                                                      "nvtx_range": "step"})
    cases["gpu_metrics[node=n3,gpu=0]"] = ("gpu_metrics", {**cases["gpu_metrics"][1], "node": "n3", "gpu": 0})
    # the workload filters (0015): an IN over workload_identities, through its Distributed table
    for name in ("flamegraph_cpu", "flamegraph_ids_gpu", "top_kernels_gpu", "gpu_metrics", "cpu_while_gpu_idle",
                 "gpu_utilization_by_workload"):
        cases[f"{name}[namespace=ml,job=7]"] = (name, {**cases[name][1], "namespace": "ml", "job": "7"})
    cases["flamegraph_cpu[hours,pod=ml/a]"] = ("flamegraph_cpu", {**cases["flamegraph_cpu"][1], **hours,
                                                                   "pod": "ml/a"})
    return cases


def build_layout(workdir: Path) -> dict:
    import clickhouse_connect

    from fleetprof.store import Store, bind_named, named_query, one_line, store_sql

    config = write_config(workdir)
    path = workdir / "chdb"

    def factory(database: str | None, readonly: bool):
        settings = {"readonly": 1} if readonly else {}
        return clickhouse_connect.get_client(dsn=f"chdb://{path}", database=database, settings=settings,
                                             tz_mode="aware", chdb_options={"config-file": str(config)})

    boot = factory(None, False)
    for database in (SINGLE_DB, CLUSTER_DB):
        boot.command(store_sql("create_database"), parameters={"database": database})
    single, sharded = Store(factory, SINGLE_DB, str(path)), Store(factory, CLUSTER_DB, str(path))
    single.migrate()
    for _, statement in cluster_statements():
        sharded.client.command(single_node_form(statement))
    report: dict = {"migrate_on_cluster": sharded.migrate()}
    _, rows = sharded.query_sql(store_sql("applied_migrations"))
    report["applied_versions"] = [r[0] for r in rows]

    report["columns"], report["engines"] = compare_schemas(boot)
    base = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(hours=1)
    base -= timedelta(seconds=base.second % 10)
    for table, (columns, rows) in known_rows(base).items():
        single.insert(table, rows, columns)
        sharded.insert(table, rows, columns)
    report["placement"], report["colocation"] = placement(single, sharded)

    def run(store: Store, name: str, params: dict, settings: dict | None = None) -> list[str]:
        """A named query's rows as sorted text: the store's own path, or its client with extra settings."""
        if settings is None:
            _, rows = store.query_named(name, params)
        else:
            query = named_query(name)
            rows = store.client.query(query.sql, parameters=bind_named(query, params), settings=settings).result_rows
        return sorted(repr(tuple(row)) for row in rows)

    report["queries"], report["deny_refused"], report["local_mode"] = {}, [], {}
    for case, (name, params) in query_cases(base).items():
        entry = {"error": None, "single": run(single, name, params), "sharded": None}
        try:
            entry["sharded"] = run(sharded, name, params)
        except Exception as exc:  # reported, so that the test names every query that fails
            entry["error"] = one_line(exc)
        report["queries"][case] = entry
        if case == name:  # deny, on each named query in its own form (a variant would only repeat its refusal)
            try:
                run(sharded, name, params, {"distributed_product_mode": "deny"})
            except Exception as exc:
                if "DISTRIBUTED_IN_JOIN_SUBQUERY_DENIED" in str(exc):
                    report["deny_refused"].append(case)
        if case == "top_kernels_gpu[comm=train]":
            report["local_mode"][case] = {"sharded": run(sharded, name, params, {"distributed_product_mode": "local"})}
    return report


def compare_schemas(client) -> tuple[dict, dict]:
    """Columns (name, type, codec) of every single-node table and view against its cluster counterpart(s), and the
    engine definition (engine, partitions, ORDER BY, TTL, settings) of every single-node table against the table that
    stores its rows on the cluster."""
    def columns(database: str) -> dict[str, list]:
        result = client.query("SELECT table, name, type, compression_codec FROM system.columns "
                              "WHERE database = {db:String} ORDER BY table, position", parameters={"db": database})
        out: dict[str, list] = {}
        for table, name, ch_type, codec in result.result_rows:
            out.setdefault(table, []).append([name, ch_type, codec])
        return out

    def engines(database: str) -> dict[str, str]:
        result = client.query("SELECT name, engine_full FROM system.tables WHERE database = {db:String}",
                              parameters={"db": database})
        return dict(result.result_rows)

    single, cluster = columns(SINGLE_DB), columns(CLUSTER_DB)
    missing, different = [], {}
    distributed = sharding()
    for table, cols in single.items():
        if table not in cluster:
            missing.append(table)
            continue
        # the Distributed table has the same names and types, and no codecs: it stores nothing
        wanted = [[n, t, ""] for n, t, _ in cols] if table in distributed else cols
        if cluster[table] != wanted:
            different[table] = {"single": cols, "cluster": cluster[table]}
        if table in distributed:
            local = distributed[table][0]
            if cluster.get(local) != cols:
                different[local] = {"single": cols, "cluster": cluster.get(local)}
    single_engines, cluster_engines = engines(SINGLE_DB), engines(CLUSTER_DB)
    engine_diff, checked = {}, 0
    for table, full in single_engines.items():
        if not full or full.startswith("View"):
            continue
        stored = distributed.get(table, (table,))[0]
        # the replicated form of the single node's deduplication window
        expected = full.replace("non_replicated_deduplication_window", "replicated_deduplication_window")
        checked += 1
        if cluster_engines.get(stored) != expected:
            engine_diff[stored] = {"single": full, "cluster": cluster_engines.get(stored)}
    return {"missing": missing, "different": different}, {"different": engine_diff, "checked": checked}


def placement(single, sharded) -> tuple[dict, dict]:
    """Rows per shard of every Distributed table (and the single node's count), and stack/sample pairs that sit on
    different shards."""
    out = {}
    for table in stored():
        _, per_shard = sharded.query_sql(f"SELECT _shard_num, count() FROM {table} GROUP BY _shard_num")
        _, total = single.query_sql(f"SELECT count() FROM {table}")
        counts = {str(s): 0 for s in range(1, SHARDS + 1)}
        counts.update({str(s): n for s, n in per_shard})
        out[table] = {"per_shard": counts, "single": total[0][0]}
    apart = {}
    for table in ("cpu_samples", "gpu_kernel_samples", "gpu_copy_samples"):
        _, rows = sharded.query_sql(
            f"SELECT count() FROM (SELECT stack_id, _shard_num AS shard FROM {table}) AS s "
            f"INNER JOIN (SELECT stack_id, _shard_num AS shard FROM stacks) AS d ON d.stack_id = s.stack_id "
            f"WHERE s.shard != d.shard", )
        apart[table] = rows[0][0]
    return out, apart


if __name__ == "__main__":
    target = Path(sys.argv[1])
    (target / "report.json").write_text(json.dumps(build_layout(target), default=str))
    sys.stdout.flush()
    os._exit(0)  # chDB's engine needs no orderly shutdown here, and skipping it keeps the child quick
