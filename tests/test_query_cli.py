"""`fleetprof query|sql|db` through the owning process's API, through the chDB directory itself, and when busy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner, Result

from fleetprof.api import serve_api
from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from fleetprof.settings import REPO_ROOT
from fleetprof.store import migration_files

TOP = [{"function": "compute", "binary": "app", "self": 5, "total": 5, "share": 0.5},
       {"function": "io", "binary": "libc.so.6", "self": 3, "total": 3, "share": 0.3},
       {"function": "idle", "binary": "app", "self": 2, "total": 2, "share": 0.2},
       {"function": "main", "binary": "app", "self": 0, "total": 10, "share": 0.0},
       {"function": "run", "binary": "app", "self": 0, "total": 8, "share": 0.0}]
FOLDED = "main;run;compute 5\nmain;run;run;io 3\nmain;idle 2\n"


def silent_address() -> str:
    """host:port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def base_args(cpu) -> list[str]:
    data_dir = os.path.dirname(cpu.store.location)  # the session's store is <data-dir>/chdb
    return ["--data-dir", data_dir, "--database", cpu.store.database]


def window(cpu) -> list[str]:
    return ["--since", cpu.since.isoformat(), "--until", cpu.until.isoformat()]


def run_here(args: list[str], api: str) -> Result:
    """The CLI in this process, which already owns the chDB directory, so it opens the store directly."""
    for command in COMMANDS:
        cli.add_command(command)
    return CliRunner().invoke(cli, args, env={"FLEETPROF_API": api, "FLEETPROF_CLICKHOUSE": ""})


def run_elsewhere(args: list[str], api: str) -> subprocess.CompletedProcess:
    """The CLI in another process: it cannot open this process's chDB directory, so only the API can answer."""
    env = {k: v for k, v in os.environ.items() if k != "FLEETPROF_CLICKHOUSE"}
    env["FLEETPROF_API"] = api
    return subprocess.run([sys.executable, "-m", "fleetprof", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def api(cpu_store):
    server = serve_api(cpu_store.store, "127.0.0.1", 0)
    try:
        yield server.address
    finally:
        server.stop()


# --- through the API ------------------------------------------------------------------------------------------------


def test_top_and_flamegraph_through_the_api(cpu_store, api):
    done = run_elsewhere([*base_args(cpu_store), "query", "top", "--kind", "cpu", *window(cpu_store),
                          "--format", "json"], api)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == TOP
    done = run_elsewhere([*base_args(cpu_store), "query", "flamegraph", *window(cpu_store), "--node", "n1"], api)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "main;run;compute 5\nmain;run;run;io 3\n"


def test_sql_through_the_api(cpu_store, api):
    done = run_elsewhere([*base_args(cpu_store), "sql", "SELECT node, sum(count) AS n FROM cpu_samples "
                          "WHERE pid = {pid:UInt32} GROUP BY node", "--param", "pid=20", "--format", "csv"], api)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "node,n\nn2,2\n"
    done = run_elsewhere([*base_args(cpu_store), "sql", "DROP TABLE cpu_samples"], api)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "readonly" in done.stderr.lower()


def test_busy_store_without_an_api(cpu_store):
    silent = silent_address()
    done = run_elsewhere([*base_args(cpu_store), "query", "top", *window(cpu_store)], silent)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (f"Error: the store at {os.path.realpath(cpu_store.store.location)} is owned by another "
                           f"fleetprof process whose API does not answer at {silent}\n")


# --- opening the store directly -------------------------------------------------------------------------------------


def test_top_opening_the_store_directly(cpu_store):
    silent = silent_address()
    result = run_here([*base_args(cpu_store), "query", "top", *window(cpu_store), "--format", "json"], silent)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == TOP
    result = run_here([*base_args(cpu_store), "query", "top", *window(cpu_store), "--format", "csv", "--limit", "2",
                       "--comm", "train"], silent)
    assert result.stdout == "function,binary,self,total,share\ncompute,app,5,5,0.625\nio,libc.so.6,3,3,0.375\n"
    result = run_here([*base_args(cpu_store), "query", "top", *window(cpu_store), "--pid", "20"], silent)
    assert result.exit_code == 0
    assert "idle" in result.stdout and "100.0%" in result.stdout and "compute" not in result.stdout


def test_flamegraph_to_a_file(cpu_store, tmp_path):
    out = tmp_path / "cpu.folded"
    result = run_here([*base_args(cpu_store), "query", "flamegraph", *window(cpu_store), "-o", str(out)],
                      silent_address())
    assert result.exit_code == 0, result.output
    assert out.read_text() == FOLDED
    result = run_here([*base_args(cpu_store), "query", "flamegraph", *window(cpu_store), "--format", "json"],
                      silent_address())
    assert json.loads(result.stdout)[0] == {"stack": ["main", "run", "compute"], "count": 5}


def test_sql_from_a_file(cpu_store, tmp_path):
    statement = tmp_path / "q.sql"
    statement.write_text("SELECT count() AS n FROM cpu_samples WHERE node = {node:String}")
    result = run_here([*base_args(cpu_store), "sql", "--file", str(statement), "-p", "node=n1", "--format", "json"],
                      silent_address())
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"n": 2}]


def test_db_migrate_prints_what_it_applied(cpu_store):
    args = ["--data-dir", os.path.dirname(cpu_store.store.location), "--database", cpu_store.store.database + "_m"]
    result = run_here([*args, "db", "migrate"], silent_address())
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [name for _, name, _ in migration_files()]
    result = run_here([*args, "db", "migrate"], silent_address())
    assert result.stdout == "" and "up to date" in result.stderr


@pytest.mark.parametrize("extra, code, needle", [
    (["--since", "yesterday"], 1, "not a time"),
    (["--since", "2025-01-02", "--until", "2025-01-01"], 1, "must be before"),
    (["--kind", "tpu"], 2, "tpu"),
    (["--pid", "0"], 2, "pid"),
])
def test_bad_arguments(cpu_store, extra, code, needle):
    result = run_here([*base_args(cpu_store), "query", "top", *extra], silent_address())
    assert result.exit_code == code
    assert needle in result.stderr
    if code == 1:
        assert result.stderr.count("\n") == 1


def test_sql_needs_exactly_one_statement(cpu_store, tmp_path):
    result = run_here([*base_args(cpu_store), "sql"], silent_address())
    assert result.exit_code == 1 and "either a statement or --file" in result.stderr
    result = run_here([*base_args(cpu_store), "sql", "SELECT 1", "--param", "novalue"], silent_address())
    assert result.exit_code == 1 and "name=value" in result.stderr


def test_table_output_keeps_bracketed_names(capsys):
    from fleetprof.commands.sql import emit

    emit(["function", "binary", "self"], [["__schedule", "[kernel.kallsyms]", 3], ["[unknown] 0x10", "[unknown]", 1]],
         "table")
    out = capsys.readouterr().out
    assert "[kernel.kallsyms]" in out and "[unknown] 0x10" in out
