"""Security properties: secrets never on a command line nor in logs; servers on loopback by default; every query
takes bound parameters; no processor opens a file that a message names."""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner

from fleetprof.settings import REPO_ROOT, Settings
from tests.fuzz import targets

MARKER = "s3cr3t-marker-7c1f"
SECRET_WORDS = re.compile(r"pass(word|wd)?|secret|token|credential|api[-_]?key|private[-_]?key", re.I)


# ---- (a) secrets: environment or files only; never argv, never logs ---------------------------------------------

def _all_commands() -> list[tuple[str, click.Command]]:
    from fleetprof.cli import cli

    out, todo = [], [("fleetprof", cli)]
    while todo:
        name, command = todo.pop()
        out.append((name, command))
        if isinstance(command, click.Group):  # the top group loads its subcommands as they are asked for
            ctx = click.Context(command)
            todo += [(f"{name} {sub}", command.get_command(ctx, sub)) for sub in command.list_commands(ctx)]
    return out


def test_no_option_of_any_command_takes_a_secret():
    commands = _all_commands()
    assert len(commands) > 12  # every subcommand was found
    offending = [(name, opt) for name, command in commands for p in command.params if isinstance(p, click.Option)
                 for opt in p.opts + p.secondary_opts
                 if SECRET_WORDS.search(opt) and not opt.endswith("-file")]  # where a secret is read is no secret
    assert offending == []


def test_a_clickhouse_url_with_a_password_is_refused_on_the_command_line():
    from fleetprof.cli import cli

    result = CliRunner().invoke(cli, ["--clickhouse", f"https://user:{MARKER}@ch.example:8443", "db", "migrate"])
    assert result.exit_code == 2
    assert "the URL holds a password: give it in FLEETPROF_CLICKHOUSE_PASSWORD" in result.output
    assert MARKER not in result.output


def test_store_errors_name_a_server_without_its_credentials(monkeypatch):
    from fleetprof.store import StoreError, open_store

    monkeypatch.setenv("FLEETPROF_CLICKHOUSE_USER", MARKER)
    monkeypatch.setenv("FLEETPROF_CLICKHOUSE_PASSWORD", MARKER)
    port = _closed_port()
    with pytest.raises(StoreError) as err:
        open_store(f"http://user:{MARKER}@127.0.0.1:{port}", "fleetprof")
    assert f"127.0.0.1:{port}" in str(err.value) and MARKER not in str(err.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_processor_children_get_secrets_only_through_their_environment(kafka_bootstrap, tmp_path, monkeypatch):
    """`fleetprof up`'s way of starting a processor (LocalPipeline._spawn), with every secret setting holding a
    marker: the children's command lines lack it, and so does everything they log at DEBUG: one that runs, one whose
    ClickHouse server refuses it, one whose SASL handshake fails against the plaintext broker."""
    from fleetprof.local_pipeline import Child, LocalPipeline

    for name in ("FLEETPROF_KAFKA_SASL_PASSWORD", "FLEETPROF_CLICKHOUSE_PASSWORD", "FLEETPROF_CLICKHOUSE_USER",
                 "FLEETPROF_KAFKA_SASL_USERNAME"):
        monkeypatch.setenv(name, MARKER)
    monkeypatch.setenv("FLEETPROF_CLICKHOUSE", f"http://127.0.0.1:{_closed_port()}")
    settings = Settings(data_dir=tmp_path, kafka=kafka_bootstrap)
    assert settings.kafka_config()["sasl.password"] == MARKER  # the setting is live, not ignored
    pipeline = LocalPipeline(settings)

    def make(stage: str, index: int, **env: str) -> Child:
        return Child(stage, index, tmp_path / f"{stage}.log", env={**os.environ, **env},
                     argv=[sys.executable, "-m", "fleetprof", "process", stage, "--log-level", "DEBUG"])

    running = make("symbolize", 0)
    sasl = {"FLEETPROF_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "FLEETPROF_KAFKA_SASL_MECHANISM": "PLAIN"}
    children = [running, make("sink", 1), make("correlate", 2, **sasl)]
    try:
        for child in children:
            pipeline._spawn(child)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "starting stage symbolize" not in running.log_path.read_text():
            time.sleep(0.2)
        time.sleep(3)  # past start-up: the feed reads the symbols topic, the runner joins its group
        for child in children:
            if child.proc.poll() is None:
                assert MARKER not in _cmdline(child.proc.pid)
        assert running.proc.poll() is None, running.log_path.read_text()[-2000:]
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.proc.kill()
    logs = {c.name: c.log_path.read_text() for c in children}
    assert "starting stage symbolize" in logs["symbolize"] and "stage symbolize stopped" in logs["symbolize"]
    assert "starting stage sink" in logs["sink"] and "Connection refused" in logs["sink"]  # the store's server
    assert "starting stage correlate" in logs["correlate"] and "Failed to get metadata" in logs["correlate"]  # SASL
    for stage, text in logs.items():
        assert MARKER not in text, f"{stage} logged a secret"


# ---- (b) servers listen on loopback unless told otherwise -------------------------------------------------------

def _listening_address(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port`, from /proc/net/tcp{,6} (what `ss -l` reads)."""
    found = set()
    for name in ("tcp", "tcp6"):
        path = Path(f"/proc/net/{name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                words = [raw[i:i + 4][::-1] for i in range(0, len(raw), 4)]  # each 32-bit word in host order
                found.add(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, b"".join(words)))
    return found


def test_default_addresses_are_loopback(monkeypatch):
    from fleetprof.commands.ui import DEFAULT_LISTEN, ui

    monkeypatch.delenv("FLEETPROF_API", raising=False)
    assert Settings().api == "127.0.0.1:7474"
    (listen,) = [p for p in ui.params if p.name == "listen"]
    assert listen.default == DEFAULT_LISTEN == "127.0.0.1:7475"


def test_the_api_and_the_ui_serve_on_loopback_by_default(store):
    from fleetprof.api import serve_api
    from fleetprof.app_server import serve_app
    from fleetprof.query_client import StoreTarget
    from fleetprof.webui.routes import ui_app

    api = serve_api(store, port=0)  # the host is the default
    try:
        assert _listening_address(api.port) == {"127.0.0.1"}
        assert httpx.get(f"http://127.0.0.1:{api.port}/healthz", timeout=10).status_code == 200
    finally:
        api.stop()
    from fleetprof.addresses import parse_address
    from fleetprof.commands.ui import DEFAULT_LISTEN

    host, _ = parse_address(DEFAULT_LISTEN)
    server = serve_app(ui_app(StoreTarget(store)), host, 0, "the web UI")
    try:
        assert _listening_address(server.port) == {"127.0.0.1"}
    finally:
        server.stop()


def test_metrics_serve_on_loopback_by_default():
    from processors.metrics import serve_metrics

    port = _closed_port()
    serve_metrics(port)  # what --metrics-port does; the server thread lives as long as the test process
    assert _listening_address(port) == {"127.0.0.1"}
    assert b"fleetprof" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).content


# ---- (c) bound parameters ---------------------------------------------------------------------------------------

SQL_METHODS = {"query", "command", "query_sql", "query_df", "query_arrow", "query_np", "raw_query", "insert",
               "raw_insert", "query_named", "query_named_arrow", "execute"}
# statements as this code base writes them (upper case), so that English words in log lines do not count
SQL_WORDS = re.compile(r"\b(SELECT|INSERT\s+INTO|CREATE\s+(TABLE|DATABASE|VIEW)|ALTER\s+TABLE|DROP|DELETE\s+FROM|"
                       r"OPTIMIZE\s+TABLE|TRUNCATE|WHERE\s+\w+\s*=)\b")
PRODUCT = ["fleetprof", "processors", "producers", "schemas", "bench", "infra"]


def _built_strings(expr: ast.AST) -> list[ast.AST]:
    """Parts of an expression that build a string at run time: f-strings, %, + on strings, str.format, join."""
    found = []
    for node in ast.walk(expr):
        if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in node.values):
            found.append(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)) and any(
                isinstance(side, (ast.Constant, ast.JoinedStr)) and isinstance(getattr(side, "value", ""), str)
                for side in (node.left, node.right)):
            found.append(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("format",
                                                                                                         "join"):
            found.append(node)
    return found


def sql_built_from_values(source: str) -> dict[int, str]:
    """The lines of `source` that build SQL text at run time: the statement argument of a query/insert call built
    from values, or a formatted string that reads as SQL."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SQL_METHODS:
            statement = node.args[0] if node.args else next((k.value for k in node.keywords
                                                             if k.arg in ("query", "sql", "cmd")), None)
            if statement is not None and _built_strings(statement):
                found[node.lineno] = ast.unparse(node)[:100]
        if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in node.values):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if SQL_WORDS.search(text):
                found[node.lineno] = ast.unparse(node)[:100]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str) and SQL_WORDS.search(node.left.value):
            found[node.lineno] = ast.unparse(node)[:100]
    return found


def test_the_check_finds_sql_built_from_values():
    bad = ('client.query(f"SELECT * FROM t WHERE node = \'{node}\'")\n'
           'store.command("SELECT * FROM t WHERE a = %s" % a)\n'
           'store.query_sql("SELECT " + col)\n'
           'client.query("SELECT {}".format(x))\n'
           'sql = f"DELETE FROM t WHERE id = {i}"\n')
    assert sorted(sql_built_from_values(bad)) == [1, 2, 3, 4, 5]
    good = ('store.query_sql("SELECT {node:String} AS n", {"node": node})\n'
            'client.query(text, parameters=params)\n'
            'store.query_named(name, params)\n'
            'log.info(f"selected {n} rows")\n')
    assert sql_built_from_values(good) == {}


def test_no_product_code_builds_sql_from_values():
    found = {str(path.relative_to(REPO_ROOT)): hits for d in PRODUCT for path in sorted((REPO_ROOT / d).rglob("*.py"))
             if ".venv" not in path.parts and (hits := sql_built_from_values(path.read_text()))}
    assert found == {}


@pytest.fixture
def api(cpu_store):
    from fleetprof.api import serve_api

    server = serve_api(cpu_store.store, "127.0.0.1", 0)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            yield http, cpu_store
    finally:
        server.stop()


INJECTIONS = ["n1' OR '1'='1", "n1' --", "' OR 1=1 --", "n1\\'", "n1'); DROP TABLE cpu_samples; --", "{node:String}"]


def test_injection_attempts_through_the_api_are_literal_values(api):
    http, cpu = api
    odd = INJECTIONS[2]
    cpu.store.insert("cpu_samples", [[cpu.since, odd, 30, "x", "", 100, 7]],
                     ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    window = {"since": cpu.since.isoformat(), "until": cpu.until.isoformat()}
    for value in INJECTIONS:
        response = http.get("/api/query/totals_cpu", params={**window, "node": value})
        assert response.status_code == 200 and response.json()["rows"] == ([[odd, 7]] if value == odd else []), value
    # the store is untouched, and a value reaches /api/sql bound, whatever it holds
    assert sorted(http.get("/api/query/totals_cpu", params=window).json()["rows"]) == [[odd, 7], ["n1", 8], ["n2", 2]]
    for value in INJECTIONS:
        body = http.post("/api/sql", json={"sql": "SELECT {v:String} AS v", "params": {"v": value}}).json()
        assert body == {"columns": ["v"], "rows": [[value]]}


# ---- (d) no processor opens a path that came from a message -----------------------------------------------------

OPEN_CALLS = {"open", "fdopen", "read_text", "read_bytes", "write_text", "write_bytes", "Path", "scandir", "listdir",
              "stat", "lstat", "readlink", "mkstemp", "NamedTemporaryFile", "TemporaryFile"}


def test_the_file_access_in_processors_is_what_was_audited():
    """Every call in processors/ that can touch the file system. Each was read: debuginfod opens only the temporary
    file it made itself (mkstemp), after the build id passed the hex-only check; nothing else opens a file. A new
    one must be audited the same way before it joins this list."""
    found = set()
    for path in sorted((REPO_ROOT / "processors").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in OPEN_CALLS:
                    found.add((path.name, name))
    assert found == {("debuginfod.py", "mkstemp"), ("debuginfod.py", "fdopen"), ("debuginfod.py", "open")}


PATHS = ["/etc/shadow", "/etc/passwd", "../../x", "../../etc/passwd", "/proc/self/mem", "/tmp/perf-1.map",
         "/dev/zero", "perfmap:../../x"]


def _paths_batch() -> dict:
    maps = [{"start": 0x1000 * (i + 1), "limit": 0x1000 * (i + 2), "file_offset": 0, "path": p, "build_id": b}
            for i, (p, b) in enumerate(zip(PATHS, reversed(PATHS), strict=True))]
    return {"node": "n", "window_start_ns": 10**18, "window_ns": 10**10, "frequency_hz": 19,
            "kernel_build_id": "/etc/passwd", "simulated": False,
            "processes": [{"pid": 1, "comm": "/etc/shadow", "exe": "/etc/shadow", "cgroup": "../../x",
                           "container_id": "", "mappings": maps,
                           "stacks": [{"tid": 1, "user_addrs": [0x1000 * (i + 1) + 8 for i in range(len(PATHS))],
                                       "kernel_addrs": [-8], "count": 1}]}]}


def test_path_like_values_in_messages_open_nothing():
    """Mapping paths, build ids, kernel build ids and perf-map ids that name files, through every stage."""
    harnesses = {name: targets.StageHarness(make) for name, make in targets.stage_factories().items()}
    launch = {"node": "n", "pid": 1, "tid": 1, "process_start_ns": 0, "time_ns": 10**18, "correlation_id": 1,
              "callback_id": 1, "api_name": "/etc/shadow", "weight": 1, "user_addrs": [0x1008],
              "mappings": _paths_batch()["processes"][0]["mappings"], "simulated": False}
    kernel = {"node": "n", "pid": 1, "process_start_ns": 0, "correlation_id": 1, "start_ns": 10**18,
              "end_ns": 10**18 + 9, "device_id": 0, "stream_id": 1, "kernel_name": "../../x", "simulated": False}
    batch = targets.as_messages("cpu.stacks", [_paths_batch()], columnar=True)
    pair = targets.as_messages("gpu.launches", [launch]) + targets.as_messages("gpu.kernels", [kernel])
    try:
        with targets.Opens() as opened:  # each run also checks that it opened no data file at all
            out = harnesses["symbolize"].run(batch)
            correlated = harnesses["correlate"].run(pair)
        frames = {f["binary"] for p in out for f in p.record.get("frames", [])}
        assert {"shadow", "passwd", "x", "mem", "perf-1.map", "zero"} <= frames  # they were used, as names
        assert any(p.topic == "gpu.samples" and p.record["samples"] for p in correlated)
        assert not set(opened.paths) & set(PATHS) and opened.data_paths() == [], opened.paths
    finally:
        for h in harnesses.values():
            h.close()


def test_debuginfod_asks_for_hex_build_ids_only(tmp_path):
    """A build id from a message goes into a URL and names a temporary file's content: anything but hex is refused
    before any request or file."""
    from processors.debuginfod import DebuginfodClient

    client = DebuginfodClient([f"http://127.0.0.1:{_closed_port()}"], tmp_dir=str(tmp_path))
    try:
        with targets.Opens() as opened:
            for build_id in PATHS + ["ab/../../cd", "AB" * 20, "sha256:" + "0" * 57, "ab" * 65, "a", ""]:
                got = client.fetch(build_id)
                assert (got.outcome, got.table) == ("invalid", None), build_id
        assert client.requests == 0 and opened.data_paths() == [] and list(tmp_path.iterdir()) == []
    finally:
        client.close()
