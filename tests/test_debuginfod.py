"""debuginfod as a second symbol source, against a real `debuginfod -F` serving a stripped binary and its separate
debug file built here: the client, the symbolize stage (stripped table or none, server down, negative cache, per-batch
limits), `fleetprof symbolize --elf` on the stripped file, and the refusals (another build id's debuginfo, not ELF, too
large, ids that must never reach a URL) against a small fake server that records every request."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from processors.debuginfod import DebuginfodClient, DebuginfodSource, elf_load_segments, valid_build_id
from processors.messages import Message
from processors.symbol_tables import SymbolTables, table_from_chunks
from processors.symbolize_stage import SymbolizeStage
from producers.elf_symbols import read_elf_symbols, symbol_chunks
from tests.conftest import free_ports
from tests.elf_helpers import NmTable, gcc_build, need, readelf_build_id, readelf_loads, unavailable
from tests.pipeline_helpers import APP_BASE, cpu_batch

PROGRAM = """
#include <stdio.h>
static volatile int sink;
static int __attribute__((noinline)) leaf_work(int n) { int s = 0; for (int i = 0; i < n; i++) s += i * i;
                                                        sink = s; return s; }
int __attribute__((noinline)) middle_step(int n) { return leaf_work(n) + leaf_work(n / 2); }
static int __attribute__((noinline)) outer_loop(int n) { int t = 0; for (int i = 0; i < 3; i++) t += middle_step(n);
                                                         return t; }
int main(int argc, char **argv) { (void)argv; printf("%d\\n", outer_loop(argc * 1000)); return 0; }
"""
ROOT_FIRST = ["main", "outer_loop", "middle_step", "leaf_work"]
OTHER_ID = "ab" * 20  # a well-formed build id nobody built here


@dataclass
class Built:
    full: Path  # with .symtab and DWARF, outside the served directory
    stripped: Path  # served: what a node runs
    debug: Path  # served: objcopy --only-keep-debug
    build_id: str
    nm: NmTable

    def middle(self, name: str) -> int:
        """The vaddr halfway into the function, by nm."""
        (start,) = self.nm.addr_of[name]
        return start + self.nm.sizes[start] // 2

    def file_offset(self, vaddr: int) -> int:
        for off, seg_vaddr, memsz in readelf_loads(str(self.full)):
            if seg_vaddr <= vaddr < seg_vaddr + memsz:
                return vaddr - seg_vaddr + off
        raise AssertionError(f"0x{vaddr:x} is in no PT_LOAD")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("debuginfod")
    full = gcc_build(tmp, "prog", PROGRAM, "-g", "-O0", "-Wl,--build-id")
    served = tmp / "served"
    served.mkdir()
    stripped, debug = served / "prog", served / "prog.debug"
    subprocess.run([need("strip"), "--strip-all", "-o", str(stripped), str(full)], check=True)
    subprocess.run([need("objcopy"), "--only-keep-debug", str(full), str(debug)], check=True)
    build_id = readelf_build_id(str(full))
    assert valid_build_id(build_id) and readelf_build_id(str(stripped)) == build_id
    assert read_elf_symbols(stripped).section != ".symtab"
    return Built(full, stripped, debug, build_id, NmTable(str(full), dynamic=False))


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def server(built: Built) -> Iterator[str]:
    """A real debuginfod scanning the served directory; its URL once it serves the build id."""
    exe = need("debuginfod")
    (port,) = free_ports(1)
    work = built.full.parent
    env = {k: v for k, v in os.environ.items() if k != "DEBUGINFOD_URLS"}  # no federation back to itself
    with open(work / "debuginfod.log", "wb") as logf:
        proc = subprocess.Popen([exe, "-F", str(work / "served"), "-p", str(port), "-d", str(work / "index.sqlite"),
                                 "-t", "0", "-g", "0", "-c", "1", "-v"], stdout=logf, stderr=subprocess.STDOUT,
                                env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while _status(f"{url}/buildid/{built.build_id}/debuginfo") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (work / "debuginfod.log").read_text(errors="replace")[-2000:]
                unavailable(f"debuginfod did not serve {built.build_id} (exit {proc.poll()}): {tail}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class FakeServer:
    """Answers every /buildid/<id>/<kind> with routes[kind] (status, body), 404 otherwise; records each path."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.routes: dict[str, tuple[int, bytes]] = {}
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                fake.paths.append(self.path)
                status, body = fake.routes.get(self.path.rsplit("/", 1)[-1], (404, b"not found"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.close()


def _stripped_tables(built: Built) -> SymbolTables:
    """What the symbols topic holds for the stripped binary: the agent's table of it (no function symbols)."""
    tables = SymbolTables()
    for chunk in symbol_chunks(built.stripped):
        tables.add_chunk(chunk)
    assert len(tables.get(built.build_id)) == 0
    return tables


def _message(built: Built, offset: int = 0, build_id: str = "") -> Message:
    """One stack through the binary, mapped whole at APP_BASE (file offset 0), leaf first."""
    addrs = [APP_BASE + built.file_offset(built.middle(f)) for f in reversed(ROOT_FIRST)]
    rec = cpu_batch("n1", build_id or built.build_id, 10**18,
                    [{"tid": 1, "user_addrs": addrs, "kernel_addrs": [], "count": 3}])
    return Message("cpu.stacks", 0, offset, b"n1", "fleetprof.CpuStackBatch", rec)


def _run(stage: SymbolizeStage, msg: Message) -> list[str]:
    """The root-first function names of the message's one stack, as the stage symbolizes it."""
    stage.before_batch([msg])
    (out,) = stage.process([msg])
    stage.after_abort()  # so the next call sends every definition again
    names = {f["frame_id"]: f["function"] for f in out.record["frames"]}
    (stack,) = out.record["stacks"]
    return [names[i] for i in stack["frame_ids"]]


def _unknown(built: Built) -> list[str]:
    return [f"[unknown] app+0x{built.file_offset(built.middle(f)):x}" for f in ROOT_FIRST]


# --- the client against the real server ---


def test_client_names_functions_at_nm_addresses(built: Built, server: str, tmp_path: Path) -> None:
    client = DebuginfodClient([server], tmp_dir=str(tmp_path))
    got = client.fetch(built.build_id)
    assert got.outcome == "ok" and got.url == server, got.reason
    table = got.table
    for name in ROOT_FIRST:
        (start,) = built.nm.addr_of[name]
        i = int(table.lookup(np.array([start, built.middle(name)], dtype=np.uint64))[0])
        assert table.names[i] == name and int(table.starts[i]) == start
        assert int(table.lookup(np.array([built.middle(name)], dtype=np.uint64))[0]) == i
    # no table known before: the load segments come from the head of /executable, not from the debug file
    own = read_elf_symbols(built.stripped)
    assert table.seg_offsets.tolist() == own.seg_offsets.tolist()
    assert table.seg_vaddrs.tolist() == own.seg_vaddrs.tolist()
    assert list(tmp_path.iterdir()) == []  # the temporary download is gone
    assert client.fetch(OTHER_ID).outcome == "not_found"
    client.close()


def test_load_segments_when_no_table_is_held(built: Built, fake: FakeServer) -> None:
    own = read_elf_symbols(built.stripped)
    fake.routes["debuginfo"] = (200, built.full.read_bytes())  # a whole unstripped binary: its own segments do
    got = DebuginfodClient([fake.url]).fetch(built.build_id)
    assert got.outcome == "ok" and got.table.seg_offsets.tolist() == own.seg_offsets.tolist()
    fake.routes["debuginfo"] = (200, built.debug.read_bytes())  # a debug file's program headers have no offsets
    got = DebuginfodClient([fake.url]).fetch(built.build_id)
    assert got.outcome == "no_segments" and got.table is None
    segments = (own.seg_offsets, own.seg_vaddrs, own.seg_memsz)  # known from the table held: no /executable needed
    fake.paths.clear()
    got = DebuginfodClient([fake.url]).fetch(built.build_id, "prog", segments)
    assert got.outcome == "ok" and got.table.binary == "prog"
    assert got.table.seg_offsets.tolist() == own.seg_offsets.tolist()
    assert fake.paths == [f"/buildid/{built.build_id}/debuginfo"]


def test_load_segments_from_the_file_head(built: Built) -> None:
    head = built.stripped.read_bytes()[:65536]
    loads = elf_load_segments(head, built.build_id)
    assert [(o, v, m) for o, v, _, m, _ in loads] == readelf_loads(str(built.stripped))
    assert elf_load_segments(head, OTHER_ID) is None  # its build-id note names another build
    assert elf_load_segments(b"\x7fELF" + bytes(10)) is None


# --- the symbolize stage ---


def test_stage_names_a_stripped_binary_from_debuginfod(built: Built, server: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEBUGINFOD_URLS", f"  {server}/  ")
    source = DebuginfodSource.from_env()
    tables = _stripped_tables(built)
    stage = SymbolizeStage(tables, debuginfod=source)
    assert _run(stage, _message(built)) == ROOT_FIRST
    assert source.fetches == 1 and len(tables.get(built.build_id)) > 0
    assert _run(stage, _message(built, 1)) == ROOT_FIRST
    assert source.fetches == 1  # the better table is held: not asked again
    stage.close()


def test_a_replaced_table_does_not_reuse_names_by_old_symbol_index(built: Built, server: str) -> None:
    """A .dynsym-like table without middle_step: the functions after it sit one index lower than in the full table,
    so frame names remembered by (build id, symbol index) must be forgotten when debuginfod replaces it."""
    (chunk,) = symbol_chunks(built.full, max_bytes=None)
    keep = [i for i, n in enumerate(chunk["names"]) if n != "middle_step"]
    partial = {**chunk, **{k: [chunk[k][i] for i in keep] for k in ("addrs", "sizes", "names")}}
    tables = SymbolTables()
    tables.put(table_from_chunks([partial]))
    stage = SymbolizeStage(tables, debuginfod=DebuginfodSource(DebuginfodClient([server])))
    assert _run(stage, _message(built)) == ROOT_FIRST
    assert _run(stage, _message(built, 1)) == ROOT_FIRST


def test_stage_asks_for_a_missing_table_before_the_batch(built: Built, server: str) -> None:
    source = DebuginfodSource(DebuginfodClient([server]))
    tables = SymbolTables()
    stage = SymbolizeStage(tables, debuginfod=source)
    msg = _message(built)
    stage.before_batch([msg])
    assert source.fetches == 1 and built.build_id in tables
    assert _run(stage, msg) == ROOT_FIRST
    assert source.fetches == 1


def test_stage_without_debuginfod_leaves_frames_unknown(built: Built, server: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBUGINFOD_URLS", raising=False)
    assert DebuginfodSource.from_env() is None
    monkeypatch.setenv("DEBUGINFOD_URLS", "")
    assert DebuginfodSource.from_env() is None
    stage = SymbolizeStage(_stripped_tables(built), debuginfod=DebuginfodSource.from_env())
    assert _run(stage, _message(built)) == _unknown(built)


def test_stage_with_the_server_down_tries_each_build_id_once(built: Built) -> None:
    (port,) = free_ports(1)  # nobody listens there
    client = DebuginfodClient([f"http://127.0.0.1:{port}"])
    stage = SymbolizeStage(_stripped_tables(built), debuginfod=DebuginfodSource(client))
    for offset in range(3):
        assert _run(stage, _message(built, offset)) == _unknown(built)
    assert client.requests == 1


def test_misses_are_remembered_for_a_while(built: Built, fake: FakeServer) -> None:
    now = [1000.0]
    client = DebuginfodClient([fake.url], clock=lambda: now[0])
    source = DebuginfodSource(client, negative_ttl_s=600)
    stage = SymbolizeStage(_stripped_tables(built), debuginfod=source)
    for offset in range(3):
        assert _run(stage, _message(built, offset)) == _unknown(built)
    assert fake.paths == [f"/buildid/{built.build_id}/debuginfo"]
    now[0] += 601
    assert _run(stage, _message(built, 3)) == _unknown(built)
    assert len(fake.paths) == 2


def test_a_batch_asks_for_a_bounded_number_of_build_ids(fake: FakeServer) -> None:
    source = DebuginfodSource(DebuginfodClient([fake.url]), max_fetches_per_batch=2)
    ids = [f"{i:02x}" * 20 for i in range(5)]
    assert source.improve(ids, SymbolTables()) == set()
    assert len(fake.paths) == 2
    assert source.improve(ids, SymbolTables()) == set()
    assert len(fake.paths) == 2  # the batch's look-ups are spent; the rest wait
    source.new_batch()
    source.improve(ids, SymbolTables())
    assert len(fake.paths) == 4


def test_a_table_the_feed_replaces_may_be_asked_for_again(built: Built, server: str) -> None:
    tables = _stripped_tables(built)
    source = DebuginfodSource(DebuginfodClient([server]))
    assert source.improve([built.build_id], tables) == {built.build_id}
    assert not source.wanted(built.build_id, tables.get(built.build_id))
    assert not source.forget_replaced(tables)
    tables.put(table_from_chunks(symbol_chunks(built.stripped)))  # the agent's table arrives again
    assert source.forget_replaced(tables)
    assert source.wanted(built.build_id, tables.get(built.build_id))


# --- refusals ---


def test_another_build_ids_debuginfo_is_refused(built: Built, fake: FakeServer, tmp_path: Path) -> None:
    fake.routes["debuginfo"] = (200, built.debug.read_bytes())
    client = DebuginfodClient([fake.url], tmp_dir=str(tmp_path))
    got = client.fetch(OTHER_ID)
    assert got.table is None and got.outcome == "mismatch" and built.build_id in got.reason
    stage = SymbolizeStage(_stripped_tables(built), debuginfod=DebuginfodSource(client))
    other = _message(built, build_id=OTHER_ID)
    assert _run(stage, other)[0].startswith("[unknown] app+0x")
    assert list(tmp_path.iterdir()) == []


def test_not_elf_too_large_and_server_errors_are_answers_not_exceptions(built: Built, fake: FakeServer) -> None:
    fake.routes["debuginfo"] = (200, b"<html>a proxy's error page</html>")
    client = DebuginfodClient([fake.url], backoff_s=0)
    assert client.fetch(built.build_id).outcome == "not_elf"
    fake.routes["debuginfo"] = (200, built.debug.read_bytes())
    small = DebuginfodClient([fake.url], max_bytes=1000)
    assert small.fetch(built.build_id).outcome == "too_large"
    fake.routes["debuginfo"] = (503, b"busy")
    got = client.fetch(built.build_id)
    assert got.outcome == "error" and got.transient and "503" in got.reason


def test_a_failing_server_is_skipped_for_the_next(built: Built, server: str) -> None:
    (port,) = free_ports(1)
    client = DebuginfodClient([f"http://127.0.0.1:{port}", server])
    assert client.fetch(built.build_id).outcome == "ok"
    assert client.fetch(built.build_id).outcome == "ok"
    assert client.requests == 1 + 2 + 2  # the dead one once (then backing off); debuginfo + executable twice


def test_bad_build_ids_are_never_requested(fake: FakeServer) -> None:
    fake.routes["debuginfo"] = (200, b"")
    bad = ["../x", "../../etc/passwd", "sha256:" + "ab" * 28, "", "a", "abc", "AB" * 20, "ab/cd", "ab%2f..",
           "zz" * 20, "ab" * 65, "ab cd", "ab\n", "ab?x=1"]
    client = DebuginfodClient([fake.url])
    for build_id in bad:
        assert not valid_build_id(build_id), build_id
        assert client.fetch(build_id).outcome == "invalid", build_id
    source = DebuginfodSource(client)
    assert source.improve(bad, SymbolTables()) == set()
    assert fake.paths == [] and client.requests == 0
    assert valid_build_id("ab") and valid_build_id("0f" * 64)


# --- fleetprof symbolize --elf ---


def _cli(*args: str, env: dict[str, str]) -> tuple[int, list[str], str]:
    for command in COMMANDS:
        cli.add_command(command)
    result = CliRunner().invoke(cli, ["symbolize", *args], env=env)
    return result.exit_code, result.stdout.splitlines(), result.stderr


def test_cli_names_a_stripped_file_from_debuginfod(built: Built, server: str) -> None:
    addrs = [f"{built.middle(f):x}" for f in ROOT_FIRST]
    code, lines, err = _cli("--elf", str(built.stripped), *addrs, env={"DEBUGINFOD_URLS": server})
    assert (code, lines) == (0, ROOT_FIRST), err
    assert err.count("\n") == 1 and "debuginfod: using" in err and built.build_id in err
    code, lines, err = _cli("--no-debuginfod", "--elf", str(built.stripped), *addrs, env={"DEBUGINFOD_URLS": server})
    assert (code, lines, err) == (0, ["??"] * 4, "")
    code, lines, err = _cli("--elf", str(built.stripped), *addrs, env={"DEBUGINFOD_URLS": ""})
    assert (code, lines, err) == (0, ["??"] * 4, "")


def test_cli_says_why_debuginfod_did_not_help(built: Built, fake: FakeServer) -> None:
    addr = f"{built.middle('leaf_work'):x}"
    code, lines, err = _cli("--elf", str(built.stripped), addr, env={"DEBUGINFOD_URLS": fake.url})
    assert (code, lines) == (0, ["??"]) and err.count("\n") == 1 and "not found" in err
    code, lines, err = _cli("--elf", str(built.full), addr, env={"DEBUGINFOD_URLS": fake.url})
    assert (code, lines, err) == (0, ["leaf_work"], "")  # a file with .symtab is its own answer
    assert fake.paths == [f"/buildid/{built.build_id}/debuginfo"]
    code, lines, err = _cli("--elf", str(built.stripped), addr,
                            env={"DEBUGINFOD_URLS": fake.url, "DEBUGINFOD_TIMEOUT": "soon"})
    assert code != 0 and len(lines) == 0 and "DEBUGINFOD_TIMEOUT" in err
