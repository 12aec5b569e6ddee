"""Which symbol tables the agent sends for processes that exit before their window is encoded: a short-lived process
(a compiler's cc1, a test's binary) is often the first, or the only, one to show a file."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from producers.elf_symbols import read_build_id, symbol_chunks
from producers.outbox_encoder import OutboxEncoder
from producers.process_info import batch_mappings, process_info


def _mapped_while_running(binary: Path) -> tuple[int, list[dict]]:
    """Run `binary` (a copy of sleep), read its mappings as the agent does at its first sample, then let it exit."""
    proc = subprocess.Popen([str(binary), "30"])
    try:
        deadline = time.monotonic() + 10
        while True:  # until exec has replaced the forked interpreter's mappings
            info = process_info(proc.pid)
            if info is not None and any(m.path == str(binary) for m in info.mappings) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    assert info is not None
    mappings = [m for m in batch_mappings(info, None) if m["path"] == str(binary)]
    assert mappings and mappings[0]["build_id"] == read_build_id(binary)
    return proc.pid, mappings


def _sent(encoder: OutboxEncoder, pid: int, mappings: list[dict]) -> dict[str, list[bytes]]:
    """The build ids the tables_for unit carries, with its messages' keys."""
    units = encoder.tables_for([{"pid": pid, "mappings": mappings}])
    assert len(units) <= 1
    return {bid: [m[1] for m in units[0].messages if m[1].startswith(f"{bid}/")] for bid in units[0].tables} \
        if units else {}


def test_an_exited_process_gets_its_table_through_the_same_file_the_agent_sees(tmp_path: Path) -> None:
    binary = tmp_path / "napper"
    shutil.copy(shutil.which("sleep"), binary)
    pid, mappings = _mapped_while_running(binary)
    bid = mappings[0]["build_id"]
    encoder = OutboxEncoder()
    sent = _sent(encoder, pid, mappings)
    want = symbol_chunks(binary)
    assert list(sent) == [bid] and sent[bid] == [f"{bid}/{c['chunk_index']}" for c in want]
    assert encoder.unreadable == 0 and bid in encoder.sent_build_ids


def test_a_path_now_holding_another_file_gives_nothing_until_a_live_process_maps_the_build_id(tmp_path: Path) -> None:
    binary = tmp_path / "napper"
    shutil.copy(shutil.which("sleep"), binary)
    pid, mappings = _mapped_while_running(binary)
    bid = mappings[0]["build_id"]
    shutil.copy(shutil.which("true"), binary)  # an upgrade put another program at the path once it had exited
    assert read_build_id(binary) != bid
    reads: list[str] = []
    encoder = OutboxEncoder(read_chunks=lambda path, limit: reads.append(path) or symbol_chunks(path, limit))
    assert _sent(encoder, pid, mappings) == {}  # not the other program's table, under either build id
    assert encoder.unreadable == 1 and reads == [f"/proc/{pid}/root{binary}"]
    assert _sent(encoder, pid, mappings) == {} and len(reads) == 1  # that process is not asked again, nor counted

    # the same build id at another path, mapped by a process that runs: its table goes, read through it
    again = tmp_path / "napper2"
    shutil.copy(shutil.which("sleep"), again)
    live = subprocess.Popen([str(again), "30"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            info = process_info(live.pid)
            live_maps = [m for m in batch_mappings(info, None) if m["path"] == str(again)] if info else []
            if live_maps:
                break
            time.sleep(0.01)
        assert live_maps and live_maps[0]["build_id"] == bid
        sent = _sent(encoder, live.pid, live_maps)
    finally:
        live.kill()
        live.wait()
    assert list(sent) == [bid] and len(sent[bid]) == len(symbol_chunks(again))
    assert reads[1:] == [f"/proc/{live.pid}/root{again}"] and encoder.unreadable == 1
    assert _sent(encoder, live.pid, live_maps) == {}  # once sent, never again


def test_a_file_that_is_not_elf_is_not_read_again_through_any_process(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a program\n" * 100)
    mapping = {"start": 0x1000, "limit": 0x2000, "file_offset": 0, "path": str(text), "build_id": "f" * 40}
    reads: list[str] = []
    encoder = OutboxEncoder(read_chunks=lambda path, limit: reads.append(path) or symbol_chunks(path, limit))
    me = subprocess.Popen(["sleep", "30"])
    try:
        assert _sent(encoder, me.pid, [mapping]) == {}
        assert reads == [f"/proc/{me.pid}/root{text}"] and encoder.unreadable == 1
        assert _sent(encoder, 1, [mapping]) == {}  # init maps it too, say: no process's copy is ELF either
    finally:
        me.kill()
        me.wait()
    assert len(reads) == 1 and encoder.unreadable == 1
