"""`fleetprof query metrics` over GpuMetrics records that went through the real broker and the sink into chDB:
opening the store directly and through the owning process's API, with exact rows out."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result

from fleetprof.api import serve_api
from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from fleetprof.settings import REPO_ROOT
from fleetprof.store import open_store
from processors.sink import DEVICE_COLUMNS, PROCESS_COLUMNS
from tests.pipeline_helpers import encode, produce, sink, wait_for

GIB = 1024**3


def gpu(index: int, uuid_: str, parent: str = "", util: int | None = None, xids: tuple[int, ...] = ()) -> dict:
    """A DeviceMetrics with a few known values; temperature unsupported (null) on MIG devices."""
    return {"index": index, "uuid": uuid_, "name": "fleetprof simulated H100", "parent_uuid": parent,
            "gpu_util_pct": util, "mem_util_pct": 40, "mem_used_bytes": 10 * GIB, "mem_total_bytes": 80 * GIB,
            "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "power_mw": 500_000, "power_limit_mw": 700_000,
            "temperature_c": None if parent else 65, "pcie_tx_kbps": 1000, "pcie_rx_kbps": 2000,
            "clock_event_reasons": 0, "xid_errors": list(xids)}


def process(device_index: int, pid: int, sm: int | None) -> dict:
    return {"device_index": device_index, "pid": pid, "comm": "train", "container_id": "", "sm_util_pct": sm,
            "mem_util_pct": 20, "used_memory_bytes": 4 * GIB}


def stamp(t: datetime) -> str:
    """How a stored time comes back from a query (UTC ISO-8601)."""
    return t.astimezone(UTC).isoformat()


@pytest.fixture(scope="module")
def stored(chdb_dir, kafka_bootstrap) -> Iterator[SimpleNamespace]:
    """Two nodes' polls, stored by the sink in a database of this module's own: node a has GPU 0 and GPU 1 (in MIG
    mode with one MIG device) polled at t0 and t0+1s; node b has GPU 0 polled at t0. t0 has milliseconds."""
    run = uuid.uuid4().hex[:8]
    a, b = f"qm-{run}-a", f"qm-{run}-b"
    t0 = datetime.now(tz=UTC).replace(microsecond=250_000) - timedelta(hours=1)
    t1 = t0 + timedelta(seconds=1)
    ns = [int(t.timestamp()) * 10**9 + t.microsecond * 1000 for t in (t0, t1)]
    records = [
        {"node": a, "time_ns": ns[0], "simulated": True,
         "devices": [gpu(0, "GPU-a0", util=90), gpu(1, "GPU-a1"), gpu(1, "MIG-a1-1", parent="GPU-a1")],
         "processes": [process(0, 100, 85), process(1, 200, None)]},
        {"node": a, "time_ns": ns[1], "simulated": True,
         "devices": [gpu(0, "GPU-a0", util=15, xids=(79,)), gpu(1, "GPU-a1"), gpu(1, "MIG-a1-1", parent="GPU-a1")],
         "processes": [process(0, 100, 12)]},
        {"node": b, "time_ns": ns[0], "simulated": True, "devices": [gpu(0, "GPU-b0", util=50)], "processes": []},
    ]
    produce(kafka_bootstrap, [("gpu.metrics", r["node"], encode("GpuMetrics", r)) for r in records])
    store = open_store(f"chdb://{chdb_dir}", f"t_query_metrics_{run}")
    try:
        store.migrate()
        with sink(store, kafka_bootstrap, f"query-metrics-{run}") as running:
            def count() -> int:
                return store.query_sql("SELECT count() FROM gpu_device_metrics WHERE node IN {n:Array(String)}",
                                       {"n": [a, b]})[1][0][0]
            wait_for(lambda: count() == 7, what="seven device rows", running=[running])
        yield SimpleNamespace(store=store, a=a, b=b, t0=t0, t1=t1)
    finally:
        store.close()


def base_args(s: SimpleNamespace) -> list[str]:
    # the session's store is <data-dir>/chdb
    return ["--data-dir", os.path.dirname(s.store.location), "--database", s.store.database]


def window(s: SimpleNamespace) -> list[str]:
    return ["--since", s.t0.isoformat(), "--until", (s.t1 + timedelta(seconds=1)).isoformat()]


def silent_address() -> str:
    """host:port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def run_here(args: list[str]) -> Result:
    """The CLI in this process, which owns the chDB directory, so it opens the store directly."""
    for command in COMMANDS:
        cli.add_command(command)
    return CliRunner().invoke(cli, args, env={"FLEETPROF_API": silent_address(), "FLEETPROF_CLICKHOUSE": ""})


def expected_device(s: SimpleNamespace, t: datetime, node: str, record: dict) -> dict:
    return {"ts": stamp(t), "node": node, "gpu_index": record["index"], "uuid": record["uuid"],
            "name": record["name"], "parent_uuid": record["parent_uuid"],
            **{k: v for k, v in record.items() if k not in ("index", "uuid", "name", "parent_uuid")},
            "simulated": True, "identity": ""}  # polls of an agent without identities


def test_device_rows_of_one_node_over_time(stored):
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--node", stored.a, "--format", "json"])
    assert result.exit_code == 0, result.output
    a, t0, t1 = stored.a, stored.t0, stored.t1
    assert json.loads(result.stdout) == [
        expected_device(stored, t0, a, gpu(0, "GPU-a0", util=90)),
        expected_device(stored, t0, a, gpu(1, "GPU-a1")),
        expected_device(stored, t0, a, gpu(1, "MIG-a1-1", parent="GPU-a1")),
        expected_device(stored, t1, a, gpu(0, "GPU-a0", util=15, xids=(79,))),
        expected_device(stored, t1, a, gpu(1, "GPU-a1")),
        expected_device(stored, t1, a, gpu(1, "MIG-a1-1", parent="GPU-a1")),
    ]


def test_gpu_filter_keeps_mig_devices_and_millisecond_bounds(stored):
    # --since half a second after t0 leaves t0's polls out; --gpu 1 is the GPU and its MIG device
    since = (stored.t0 + timedelta(milliseconds=500)).isoformat()
    result = run_here([*base_args(stored), "query", "metrics", "--since", since, "--until",
                       (stored.t1 + timedelta(milliseconds=1)).isoformat(), "--gpu", "1", "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == DEVICE_COLUMNS  # what an empty result's header falls back to
    assert [r[:6] for r in rows[1:]] == [
        [stamp(stored.t1), stored.a, "1", "GPU-a1", "fleetprof simulated H100", ""],
        [stamp(stored.t1), stored.a, "1", "MIG-a1-1", "fleetprof simulated H100", "GPU-a1"],
    ]
    columns = rows[0]
    assert rows[2][columns.index("temperature_c")] == ""  # null: not supported on the MIG device
    assert rows[2][columns.index("xid_errors")] == "[]"
    # until is exclusive: ending at t1 leaves t1 out
    until = stored.t1.isoformat()
    result = run_here([*base_args(stored), "query", "metrics", "--since", since, "--until", until, "--format", "json"])
    assert json.loads(result.stdout) == []
    assert result.stderr == f"0 rows: no GPU metrics from {since} to {until}\n"
    result = run_here([*base_args(stored), "query", "metrics", "--since", since, "--until", until, "--processes",
                       "--format", "csv"])
    assert result.stdout == ",".join(PROCESS_COLUMNS) + "\n"


def test_process_rows(stored):
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--processes", "--format", "json"])
    assert result.exit_code == 0, result.output
    common = {"node": stored.a, "comm": "train", "container_id": "", "mem_util_pct": 20,
              "used_memory_bytes": 4 * GIB, "simulated": True, "identity": ""}
    assert json.loads(result.stdout) == [
        {"ts": stamp(stored.t0), "gpu_index": 0, "pid": 100, "sm_util_pct": 85, **common},
        {"ts": stamp(stored.t0), "gpu_index": 1, "pid": 200, "sm_util_pct": None, **common},
        {"ts": stamp(stored.t1), "gpu_index": 0, "pid": 100, "sm_util_pct": 12, **common},
    ]
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--processes", "--format", "csv"])
    assert result.stdout.splitlines()[0] == ",".join(PROCESS_COLUMNS)


def test_through_the_api_the_same_rows(stored):
    server = serve_api(stored.store, "127.0.0.1", 0)
    try:
        env = {k: v for k, v in os.environ.items() if k != "FLEETPROF_CLICKHOUSE"}
        env["FLEETPROF_API"] = server.address
        # another process cannot open this process's chDB directory: only the API can answer it
        done = subprocess.run([sys.executable, "-m", "fleetprof", *base_args(stored), "query", "metrics",
                               *window(stored), "--node", stored.b, "--format", "json"], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [expected_device(stored, stored.t0, stored.b, gpu(0, "GPU-b0", util=50))]


def test_limit_says_it_stopped(stored):
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--node", stored.a, "--limit", "2",
                       "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [r["uuid"] for r in json.loads(result.stdout)] == ["GPU-a0", "GPU-a1"]
    assert result.stderr == "stopped at 2 rows: narrow the range or raise --limit\n"


@pytest.mark.parametrize("extra, code, needle", [
    (["--since", "yesterday"], 1, "not a time"),
    (["--since", "2025-01-02", "--until", "2025-01-01"], 1, "must be before"),
    (["--gpu", "-1"], 2, "--gpu"),
    (["--format", "pprof"], 2, "--format"),
])
def test_bad_arguments(stored, extra, code, needle):
    result = run_here([*base_args(stored), "query", "metrics", *extra])
    assert result.exit_code == code
    assert needle in result.stderr
    if code == 1:
        assert result.stderr.count("\n") == 1


# --- the table: units, --columns, empty results, simulated labels ----------------------------------------------


def shown(t: datetime) -> str:
    """How the table shows a stored time: UTC to the millisecond."""
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def ruled(header: str) -> str:
    """A table's header line and the rule under it."""
    return f"{header}\n{'─' * len(header)}\n"


def simulated(node: str) -> str:
    return f"SIMULATED: GPU readings from node {node} come from fleetprof's simulated NVML library\n"


def test_table_of_a_readable_set_in_units(stored):
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--node", stored.a])
    assert result.exit_code == 0, result.output
    t0, t1, a = shown(stored.t0), shown(stored.t1), stored.a
    # GiB, W, MHz, °C and MB/s (KiB/s / 1024) from bytes, mW and KiB/s; a MIG device by its uuid's start; null empty;
    # not a terminal: the natural width, nothing cut
    assert result.stdout == (
        ruled("time (UTC)               node           gpu         GPU util %  mem util %  mem used GiB  SM MHz"
              "  power W  temp °C  PCIe tx MB/s  PCIe rx MB/s  XID") +
        f"{t0}  {a}  0                   90          40          10.0    1980      500       65           1.0"
        "           2.0\n"
        f"{t0}  {a}  1                               40          10.0    1980      500       65           1.0"
        "           2.0\n"
        f"{t0}  {a}  1 MIG-a1-1                      40          10.0    1980      500                    1.0"
        "           2.0\n"
        f"{t1}  {a}  0                   15          40          10.0    1980      500       65           1.0"
        "           2.0  79\n"
        f"{t1}  {a}  1                               40          10.0    1980      500       65           1.0"
        "           2.0\n"
        f"{t1}  {a}  1 MIG-a1-1                      40          10.0    1980      500                    1.0"
        "           2.0\n")
    assert result.stderr == simulated(a)


def test_columns_picks_stored_columns(stored):
    picked = ["ts", "uuid", "mem_total_bytes", "power_limit_mw", "clock_event_reasons", "simulated"]
    args = [*base_args(stored), "query", "metrics", *window(stored), "--node", stored.b, "--columns", ",".join(picked)]
    result = run_here(args)
    assert result.exit_code == 0, result.output
    header = "time (UTC)               uuid    mem total GiB  power limit W  clock events  simulated"
    row = f"{shown(stored.t0)}  GPU-b0           80.0            700  0x0           yes\n"
    assert result.stdout == ruled(header) + row
    # CSV and JSON: the same columns as stored (bytes, mW), in the order asked for
    result = run_here([*args, "--format", "csv"])
    assert result.stdout == (",".join(picked) + "\n" + f"{stamp(stored.t0)},GPU-b0,{80 * GIB},700000,0,True\n")
    assert result.stderr == ""
    result = run_here([*args, "--format", "json"])
    assert json.loads(result.stdout) == [{"ts": stamp(stored.t0), "uuid": "GPU-b0", "mem_total_bytes": 80 * GIB,
                                          "power_limit_mw": 700_000, "clock_event_reasons": 0, "simulated": True}]


@pytest.mark.parametrize("extra, known", [([], DEVICE_COLUMNS), (["--processes"], PROCESS_COLUMNS)])
def test_an_unknown_column_is_a_one_line_error_naming_the_known_ones(stored, extra, known):
    result = run_here([*base_args(stored), "query", "metrics", *extra, "--columns", "ts,power,pid_x"])
    assert result.exit_code == 1
    assert result.stderr == f"Error: --columns: no column 'power', 'pid_x' (known: {', '.join(known)})\n"


def test_process_table(stored):
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--processes"])
    assert result.exit_code == 0, result.output
    t0, t1, a = shown(stored.t0), shown(stored.t1), stored.a
    assert result.stdout == (
        ruled("time (UTC)               node           gpu  pid  comm   SM util %  mem util %  used GiB") +
        f"{t0}  {a}  0    100  train         85          20       4.0\n"
        f"{t0}  {a}  1    200  train                     20       4.0\n"
        f"{t1}  {a}  0    100  train         12          20       4.0\n")
    assert result.stderr == simulated(a)


def test_an_empty_table_says_0_rows_and_the_known_values(stored):
    headers = ruled("time (UTC)  node  gpu  GPU util %  mem util %  mem used GiB  SM MHz  power W  temp °C"
                    "  PCIe tx MB/s  PCIe rx MB/s  XID")
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--node", "nosuch"])
    assert result.exit_code == 0, result.output
    # a has more readings than b: it comes first
    assert result.stdout == headers
    assert result.stderr == f"0 rows: no node 'nosuch' in this range (known: {stored.a}, {stored.b})\n"
    result = run_here([*base_args(stored), "query", "metrics", *window(stored), "--node", stored.b, "--gpu", "7"])
    assert (result.stdout, result.stderr) == (headers,
                                              f"0 rows: no GPU 7 on node {stored.b} in this range (known: 0)\n")
    until = stored.t0.isoformat()
    result = run_here([*base_args(stored), "query", "metrics", "--since", "2h", "--until", until])
    since = (stored.t0 - timedelta(hours=2)).isoformat()
    assert (result.stdout, result.stderr) == (headers, f"0 rows: no GPU metrics from {since} to {until}\n")
