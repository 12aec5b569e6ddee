"""`fleetprof sql`: placeholders typed and defaulted like named queries, the same through a running API (a real
uvicorn on a free port, JSON params over /api/sql) and through the store opened directly."""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner, Result

from fleetprof.api import serve_api
from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from fleetprof.settings import REPO_ROOT

DEVICE_COLUMNS = ["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "xid_errors", "simulated"]

WINDOW_SQL = """\
-- Readings in [since, until) of one GPU (-1: all), and the bounds as the server read them.
-- @default until = now
-- @default gpu = -1
SELECT {since:DateTime64(3)} AS since, {until:DateTime64(3)} AS until, count() AS n, groupArray(gpu_util_pct) AS utils
FROM (SELECT * FROM gpu_device_metrics
      WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
      ORDER BY ts)
"""


def silent_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def readings(store):
    """GPU 0 readings at T + 0, 0.999, 1.000 and 1.001 s (utilization 1..4), T a whole second an hour ago."""
    t = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(hours=1)
    store.insert("gpu_device_metrics", [
        [t + timedelta(milliseconds=ms), "n1", 0, "GPU-a", "H100", "", util, [], False]
        for util, ms in enumerate([0, 999, 1000, 1001], start=1)
    ], DEVICE_COLUMNS)
    store.insert("cpu_samples", [[t, "n1", 10, "train", "", 1, 5],
                                 [t + timedelta(seconds=1), "n1", 10, "train", "", 1, 7]],
                 ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    return store, t


@pytest.fixture(params=["api", "store"])
def sql_cli(request, readings):
    """Runs `fleetprof sql ARGS` in this process, through a running API or by opening the store itself."""
    store, t = readings
    server = serve_api(store, "127.0.0.1", 0) if request.param == "api" else None
    address = server.address if server else silent_address()

    def invoke(*args: str) -> Result:
        for command in COMMANDS:
            cli.add_command(command)
        base = ["--data-dir", os.path.dirname(store.location), "--database", store.database]
        env = {"FLEETPROF_API": address, "FLEETPROF_CLICKHOUSE": ""}
        return CliRunner().invoke(cli, [*base, "sql", *args], env=env)

    try:
        yield invoke, t
    finally:
        if server:
            server.stop()


def test_millisecond_bounds_survive_exactly(sql_cli, tmp_path):
    invoke, t = sql_cli
    query = tmp_path / "window.sql"
    query.write_text(WINDOW_SQL)
    since, until = t + timedelta(milliseconds=999), t + timedelta(milliseconds=1001)
    result = invoke("--file", str(query), "--param", f"since={since.isoformat()}", "--param",
                    f"until={until.isoformat()}", "--format", "json")
    assert result.exit_code == 0, result.output
    # 0.999 and 1.000 are in [since, until), 1.001 is not; the bounds come back as they went
    assert json.loads(result.stdout) == [{"since": since.isoformat(), "until": until.isoformat(), "n": 2,
                                          "utils": [2, 3]}]


def test_defaults_relative_times_and_typed_params(sql_cli, tmp_path):
    invoke, t = sql_cli
    query = tmp_path / "window.sql"
    query.write_text(WINDOW_SQL)
    # since=2h and until=now (the file's default): all four readings; gpu=0 is an Int32
    result = invoke("--file", str(query), "-p", "since=2h", "-p", "gpu=0", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].endswith(',4,"[1, 2, 3, 4]"')
    # epoch seconds; an exclusive until on a whole second
    result = invoke("--file", str(query), "-p", f"since={int(t.timestamp())}", "-p",
                    f"until={int(t.timestamp()) + 1}", "--format", "json")
    assert json.loads(result.stdout)[0]["utils"] == [1, 2]
    result = invoke("--file", str(query), "-p", "since=2h", "-p", "gpu=1", "--format", "json")
    assert json.loads(result.stdout)[0]["n"] == 0


def test_datetime_seconds_and_inline_statements(sql_cli):
    invoke, t = sql_cli
    # a DateTime placeholder (whole seconds) compared for equality: only an exact second matches
    statement = ("SELECT {at:DateTime} AS at, sum(count) AS n FROM cpu_samples "
                 "WHERE ts = {at:DateTime} AND pid = {pid:UInt32}")
    at = t + timedelta(seconds=1)
    result = invoke(statement, "-p", f"at={at.isoformat()}", "-p", "pid=10", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"at": at.isoformat(), "n": 7}]
    result = invoke("SELECT {n:UInt8} + 1 AS m, {flag:Bool} AS flag, {d:Date} AS d", "-p", "n=41", "-p", "flag=true",
                    "-p", "d=2025-03-04", "--format", "csv")
    assert result.stdout == "m,flag,d\n42,True,2025-03-04\n"


@pytest.mark.parametrize("args, message", [
    (["SELECT {n:UInt8} AS n", "-p", "m=1"], "Error: the statement has no parameter m (known: n)\n"),
    (["SELECT 1", "-p", "m=1"], "Error: the statement has no parameter m (known: none)\n"),
    (["SELECT {n:UInt8} AS n"], "Error: the statement needs parameter n (UInt8)\n"),
    (["SELECT {n:UInt8} AS n", "-p", "n=300"], "Error: parameter n: 300 is out of range for UInt8\n"),
    (["SELECT {t:DateTime} AS t", "-p", "t=yesterday"],
     "Error: parameter t: not a time: 'yesterday' (use 5m, 2h, 7d, epoch seconds or ISO-8601)\n"),
])
def test_bad_parameters_are_one_line_errors(sql_cli, args, message):
    invoke, _ = sql_cli
    result = invoke(*args)
    assert result.exit_code == 1
    assert result.stderr == message


def test_wire_values_are_epoch_text_at_the_placeholders_precision():
    from fleetprof.commands.sql import wire_value

    t = datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert wire_value("DateTime", t) == "1735787045"
    assert wire_value("DateTime64(3)", t) == "1735787045.123"
    assert wire_value("Nullable(DateTime64(9, 'UTC'))", t) == "1735787045.123456000"
    assert wire_value("DateTime64(0)", datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC)) == "-1"
    assert wire_value("UInt8", 7) == 7


RAW = ("SELECT * FROM (SELECT 'gemm' AS kernel, toUInt64(2500000000) AS gpu_ns, 0.75 AS share, toUInt64(3) AS launches "
       "UNION ALL SELECT 'copy', toUInt64(1234567), 0.25, toUInt64(1)) ORDER BY gpu_ns DESC")


def test_table_shows_nanoseconds_and_shares_for_people_csv_and_json_raw(sql_cli):
    invoke, _ = sql_cli
    result = invoke(RAW)
    assert result.exit_code == 0, result.output
    # not a terminal: the natural width, nothing cut; gpu_ns as durations and share as a percentage by their names
    assert result.stdout == ("kernel    gpu_ns  share  launches\n"
                             "─────────────────────────────────\n"
                             "gemm       2.5 s  75.0%         3\n"
                             "copy    1.235 ms  25.0%         1\n")
    assert result.stderr == ""
    result = invoke(RAW, "--format", "csv")
    assert result.stdout == "kernel,gpu_ns,share,launches\ngemm,2500000000,0.75,3\ncopy,1234567,0.25,1\n"
    result = invoke(RAW, "--format", "json")
    assert json.loads(result.stdout) == [{"kernel": "gemm", "gpu_ns": 2500000000, "share": 0.75, "launches": 3},
                                         {"kernel": "copy", "gpu_ns": 1234567, "share": 0.25, "launches": 1}]


@pytest.mark.parametrize("fmt, out", [("table", ""), ("csv", "\n"), ("json", "[]\n")])
def test_an_empty_result_says_0_rows(sql_cli, fmt, out):
    invoke, _ = sql_cli
    result = invoke("--file", str(REPO_ROOT / "sql/queries/gpu_metrics.sql"), "-p", "since=2h", "-p", "node=nosuch",
                    "--format", fmt)
    assert result.exit_code == 0, result.output
    assert (result.stdout, result.stderr) == (out, "0 rows\n")
