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
    # each process under a root frame of its own; --node picked the node, so the frame does not repeat it
    assert done.stdout == "train (pid 10);main;run;compute 5\ntrain (pid 10);main;run;run;io 3\n"


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
    result = run_here([*base_args(cpu_store), "query", "flamegraph", *window(cpu_store), "--merge-processes", "-o",
                       str(out)], silent_address())
    assert result.exit_code == 0, result.output
    assert out.read_text() == FOLDED
    result = run_here([*base_args(cpu_store), "query", "flamegraph", *window(cpu_store), "--format", "json"],
                      silent_address())
    assert json.loads(result.stdout)[0] == {"stack": ["train (pid 10 on n1)", "main", "run", "compute"], "count": 5}


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


# --- the table, empty results and simulated labels ------------------------------------------------------------------


def span(cpu) -> str:
    return f"from {cpu.since.isoformat(timespec='seconds')} to {cpu.until.isoformat(timespec='seconds')}"


def ruled(header: str) -> str:
    """A table's header line and the rule under it."""
    return f"{header}\n{'─' * len(header)}\n"


def with_gpu_time(cpu) -> None:
    """GPU time launched from two of the CPU stacks: 1.234567 ms under compute, 2.5 s under io, both on n1."""
    cpu.store.insert("gpu_kernel_samples", [[cpu.since, "n1", 10, "", "", 0, 0, 100, "gemm", 1_234_567, 3],
                                            [cpu.since, "n1", 10, "", "", 0, 0, 101, "copy", 2_500_000_000, 1]],
                     ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                      "duration_ns", "launches"])


def simulated_windows(cpu, kind: str, *nodes: str) -> None:
    """The sink's word that `kind`'s data on these nodes came from a simulated source (as loadgen's always does)."""
    cpu.store.insert("profile_windows", [[cpu.since, node, kind, True, 99] for node in nodes],
                     ["ts", "node", "kind", "simulated", "frequency_hz"])


def test_top_table(cpu_store):
    result = run_here([*base_args(cpu_store), "query", "top", *window(cpu_store)], silent_address())
    assert result.exit_code == 0, result.output
    assert result.stdout == ruled("function  binary     self  self %  total  total %") + (
        "compute   app           5   50.0%      5    50.0%\n"
        "io        libc.so.6     3   30.0%      3    30.0%\n"
        "idle      app           2   20.0%      2    20.0%\n"
        "main      app           0    0.0%     10   100.0%\n"
        "run       app           0    0.0%      8    80.0%\n")
    assert result.stderr == f"10 samples {span(cpu_store)}\n"  # nothing here says it was simulated


def test_top_gpu_shows_durations_and_says_simulated(cpu_store):
    with_gpu_time(cpu_store)
    simulated_windows(cpu_store, "gpu", "n1")
    simulated_windows(cpu_store, "cpu", "n2")  # the CPU side is no business of a GPU table
    args = [*base_args(cpu_store), "query", "top", "--kind", "gpu", *window(cpu_store)]
    result = run_here(args, silent_address())
    assert result.exit_code == 0, result.output
    assert result.stdout == ruled("function  binary         self  self %     total  total %") + (
        "io        libc.so.6     2.5 s  100.0%     2.5 s   100.0%\n"
        "compute   app        1.235 ms    0.0%  1.235 ms     0.0%\n"
        "main      app            0 ns    0.0%   2.501 s   100.0%\n"
        "run       app            0 ns    0.0%   2.501 s   100.0%\n")
    line = "SIMULATED: GPU kernel times from node n1 come from fleetprof's simulated GPU library\n"
    assert result.stderr == f"2.501 s of GPU time {span(cpu_store)}\n{line}"
    # JSON and CSV: ns and a 0..1 share as they are; the SIMULATED line stays on stderr, nothing is added per row
    result = run_here([*args, "--format", "csv", "--limit", "2"], silent_address())
    # kernel: a kernel's name as stored ('' for these, launching functions)
    assert result.stdout == ("function,binary,self,total,share,kernel\nio,libc.so.6,2500000000,2500000000,"
                             f"{2_500_000_000 / 2_501_234_567!r},\ncompute,app,1234567,1234567,"
                             f"{1_234_567 / 2_501_234_567!r},\n")
    assert result.stderr == line
    result = run_here([*args, "--format", "json", "--limit", "1"], silent_address())
    assert json.loads(result.stdout) == [{"function": "io", "binary": "libc.so.6", "self": 2_500_000_000,
                                          "total": 2_500_000_000, "share": 2_500_000_000 / 2_501_234_567,
                                          "kernel": ""}]
    assert result.stderr == line


def test_top_says_simulated_only_for_the_nodes_it_shows(cpu_store):
    simulated_windows(cpu_store, "cpu", "n2")
    result = run_here([*base_args(cpu_store), "query", "top", *window(cpu_store)], silent_address())
    assert result.stderr == (f"10 samples {span(cpu_store)}\n"
                             "SIMULATED: CPU samples from node n2 come from fleetprof loadgen's simulated fleet\n")
    result = run_here([*base_args(cpu_store), "query", "top", *window(cpu_store), "--node", "n1"], silent_address())
    assert result.stderr == f"8 samples {span(cpu_store)}\n"


EMPTY_TOP = ruled("function  binary  self  self %  total  total %")


@pytest.mark.parametrize("kind, extra, reason", [
    ("cpu", ["--node", "nosuch"], "no node 'nosuch' in this range (known: n1, n2)"),
    ("cpu", ["--comm", "nosuch"], "no comm 'nosuch' in this range (known: train, serve)"),
    ("cpu", ["--pid", "999999"], "no pid 999999 in this range (known: 10, 20)"),
    ("cpu", ["--node", "n2", "--comm", "train"], "no comm 'train' on node n2 in this range (known: serve)"),
    ("cpu", ["--node", "nosuch", "--pid", "999999"], "no node 'nosuch' in this range (known: n1, n2)"),
    # GPU rows carry no comm: the CPU sampler's name for the process is known, as `--comm train` would match it
    ("gpu", ["--comm", "nosuch"], "no comm 'nosuch' in this range (known: train)"),
    ("gpu", ["--node", "n2"], "no node 'n2' in this range (known: n1)"),
])
def test_a_filter_that_matches_nothing_names_the_known_values(cpu_store, kind, extra, reason):
    with_gpu_time(cpu_store)
    args = [*base_args(cpu_store), "query", "top", "--kind", kind, *window(cpu_store), *extra]
    result = run_here(args, silent_address())
    assert result.exit_code == 0, result.output
    assert (result.stdout, result.stderr) == (EMPTY_TOP, f"0 rows: {reason}\n")
    result = run_here([*args, "--format", "json"], silent_address())
    assert (result.stdout, result.stderr) == ("[]\n", f"0 rows: {reason}\n")


def test_empty_without_a_bad_filter(cpu_store):
    # each filter names something in the range, but not together; and a range with no samples at all
    result = run_here([*base_args(cpu_store), "query", "top", *window(cpu_store), "--pid", "20", "--comm", "train"],
                      silent_address())
    assert result.stderr == (f"0 rows: no CPU samples from {cpu_store.since.isoformat()} to "
                             f"{cpu_store.until.isoformat()} with pid 20 and comm 'train'\n")
    result = run_here([*base_args(cpu_store), "query", "top", "--kind", "gpu", *window(cpu_store)], silent_address())
    assert (result.stdout, result.stderr) == (EMPTY_TOP, f"0 rows: no GPU kernel time from "
                                              f"{cpu_store.since.isoformat()} to {cpu_store.until.isoformat()}\n")


def test_known_values_are_bounded_busiest_first(cpu_store):
    from fleetprof.commands.query_notes import why_empty
    from fleetprof.query_client import StoreTarget

    store = cpu_store.store
    store.insert("cpu_samples", [[cpu_store.since, f"busy-{i:02}", 1, "x", "", 100, 100 + i] for i in range(25)],
                 ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    target = StoreTarget(store)  # not closed: the fixture owns the store
    reason = why_empty(target, "cpu", cpu_store.since, cpu_store.until, {"node": "nosuch", "pid": 0, "comm": ""})
    busiest = ", ".join(f"busy-{i:02}" for i in range(24, 4, -1))
    assert reason == f"no node 'nosuch' in this range (known: {busiest}, …and 7 more)"
    # the given value is found however far down the list it is
    reason = why_empty(target, "cpu", cpu_store.since, cpu_store.until, {"node": "n2", "pid": 0, "comm": "nosuch"})
    assert reason == "no comm 'nosuch' on node n2 in this range (known: serve)"


def test_named_queries_through_sql_show_shares_and_durations(cpu_store):
    with_gpu_time(cpu_store)
    bounds = ["-p", f"since={cpu_store.since.isoformat()}", "-p", f"until={cpu_store.until.isoformat()}"]

    def named(name: str, *extra: str) -> Result:
        return run_here([*base_args(cpu_store), "sql", "--file", str(REPO_ROOT / f"sql/queries/{name}.sql"), *bounds,
                         *extra], silent_address())

    result = named("top_stacks_cpu")
    assert result.exit_code == 0, result.output
    assert result.stdout == ruled("stack             samples  share  nodes  processes") + (
        "main;run;compute        5  50.0%      1          1\n"
        "main;run;run;io         3  30.0%      1          1\n"
        "main;idle               2  20.0%      1          1\n")
    assert named("top_stacks_cpu", "--format", "csv").stdout.splitlines()[1] == "main;run;compute,5,0.5,1,1"
    result = named("cost_kernels")
    assert result.stdout == ruled("kernel    gpu_ns  launches") + ("copy       2.5 s         1\n"
                                                                 "gemm    1.235 ms         3\n")
    csv_text = named("cost_kernels", "--format", "csv").stdout
    assert csv_text == "kernel,gpu_ns,launches\ncopy,2500000000,1\ngemm,1234567,3\n"


def test_an_empty_flamegraph_names_the_known_values(cpu_store, tmp_path):
    args = [*base_args(cpu_store), "query", "flamegraph", *window(cpu_store)]
    result = run_here([*args, "--pid", "999999"], silent_address())
    assert result.exit_code == 0, result.output
    assert (result.stdout, result.stderr) == ("", "0 rows: no pid 999999 in this range (known: 10, 20)\n")
    out = tmp_path / "none.folded"
    result = run_here([*args, "--kind", "gpu", "--node", "n1", "-o", str(out)], silent_address())
    assert result.stderr == (f"wrote 0 stacks to {out}\n0 rows: no GPU kernel time from {cpu_store.since.isoformat()} "
                             f"to {cpu_store.until.isoformat()}\n")
    result = run_here([*args, "--node", "n1"], silent_address())
    assert result.stderr == "" and result.stdout.count("\n") == 2
