"""The web UI's flame graphs from frame ids (fleetprof/webui/model.py): named and merged as the SQL does, diffs of two
ranges, and a big random graph through the API in every encoding."""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import httpx
import orjson
import pytest

from fleetprof.api import serve_api
from fleetprof.query_client import StoreTarget
from fleetprof.webui import model

try:
    from compression import zstd  # Python 3.14 and later
except ImportError:
    from backports import zstd

BIG_FRAME = 2**63 + 5  # frame and stack ids are 64-bit hashes: the high bit is set for half of them


@pytest.fixture
def edge_store(store):
    """Stacks that trip the naming and merging rules, sampled over two minutes an hour ago: two frame ids with the
    same (function, binary), one function in two binaries, undefined frames and stacks, a stack whose newest
    definition is empty, and older definitions (of a frame and of stacks) that must lose to newer ones."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    t0 = now - timedelta(hours=1, seconds=now.second)
    old = t0 - timedelta(hours=1)
    frames = [[1, "main", "app", "NATIVE", t0], [10, "main", "app", "INTERPRETED", t0],
              [2, "run", "app", "NATIVE", t0], [2, "old_run", "app", "NATIVE", old],
              [3, "io", "libc.so.6", "NATIVE", t0], [4, "io", "app", "NATIVE", t0],
              [6, "idle", "app", "NATIVE", t0], [BIG_FRAME, "gemm_kernel", "[gpu]", "GPU_KERNEL", t0]]
    # frames 11 and 0xabc have no definition; stack 0x05 none at all; stack 2**64 - 2 an empty newest one
    stacks = [[0x100, [1, 2, 3], t0], [0x101, [10, 2, 3], t0], [0x102, [1, 2, 4], t0],
              [2**64 - 2, [], t0], [2**64 - 2, [1, 2], old], [0x103, [1, 11, 0xABC], t0],
              [0x104, [1, BIG_FRAME], t0], [0x104, [1, 3], old], [0x105, [1], t0], [0x107, [3, 1], t0],
              [0x108, [1, 6], t0]]
    first = {0x100: 5, 0x101: 4, 0x102: 9, 0x05: 2, 2**64 - 2: 2, 0x103: 2, 0x104: 1, 0x105: 2}
    second = {0x105: 7, 0x107: 3, 0x108: 3}
    cpu = [[t0 + timedelta(seconds=s), "n1", 10, "train", "", stack, n]
           for s, window in ((0, first), (60, second)) for stack, n in window.items()]
    gpu = [[t0 + timedelta(seconds=30), "n1", 10, "", "", 0, 7, 0x104, "gemm_kernel", 2**40, 1],
           [t0 + timedelta(seconds=40), "n1", 10, "", "", 0, 7, 0x103, "gemm_kernel", 5, 1]]
    store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
    store.insert("stacks", stacks, ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", cpu, ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    store.insert("gpu_kernel_samples", gpu, ["ts", "node", "pid", "comm", "container_id", "device", "stream",
                                             "stack_id", "kernel_name", "duration_ns", "launches"])
    return SimpleNamespace(store=store, first={"since": t0, "until": t0 + timedelta(seconds=60)},
                           second={"since": t0 + timedelta(seconds=60), "until": t0 + timedelta(seconds=120)})


def plain(payload: dict) -> dict:
    """An answer as the page parses it (model.py's stacks are numpy arrays)."""
    return orjson.loads(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY))


def ids_graph(store, kind: str, *windows: dict, processes: bool = False) -> dict:
    """model.py's answer for one window (or a diff of two) from the store's Arrow columns, checked against the same
    built from the rows the API gives `fleetprof ui` (JSON: ids as plain numbers). Without `processes`, the answer of
    stacks without their process (as from rows without the process columns): the naming and merging alone."""
    target = StoreTarget(store)

    def keep(ids: model.StackIds) -> model.StackIds:
        return ids if processes else dataclasses.replace(ids, process=None, processes=())

    arrays = [keep(model.StackIds.from_arrow(store.query_named_arrow(f"flamegraph_ids_{kind}", w))) for w in windows]
    names = [row for w in windows for row in store.query_named(f"flamegraph_names_{kind}", w)[1]]
    build = model.flamegraph_of_ids if len(windows) == 1 else model.flamegraph_diff_of_ids
    answer = plain(build(*arrays, names))
    rows = [model.StackIds.from_rows([r if processes else r[:3] for r in target.named(f"flamegraph_ids_{kind}", w)[1]])
            for w in windows]
    json_names = [row for w in windows for row in target.named(f"flamegraph_names_{kind}", w)[1]]
    assert plain(build(*rows, json_names)) == answer
    return answer


def test_flame_graph_from_ids_names_and_merges_like_the_sql(edge_store):
    store = edge_store.store
    got = ids_graph(store, "cpu", edge_store.first)
    assert got == {
        "frames": ["main", "run", "io", "io", "[unknown stack 0x05]", "[unknown stack 0xfffffffffffffffe]",
                   "[unknown 0x0b]", "[unknown 0x0abc]", "gemm_kernel"],
        "binaries": ["app", "libc.so.6", "", "[gpu]"],
        "frame_binary": [0, 0, 0, 1, 2, 2, 2, 2, 3],
        # each frame's language (frames.language, migration 0011): a frame or stack without a definition "unknown"
        "languages": ["native", "unknown", "gpu"], "frame_language": [0, 0, 0, 0, 1, 1, 1, 1, 2],
        # by value, then functions, then binaries (app before libc.so.6), a prefix first ([main] before main;…);
        # stacks 0x100 and 0x101 differ only in which frame id names main, so they are one stack of 5 + 4
        "stacks": [[0, 1, 2], [0, 1, 3], [4], [5], [0], [0, 6, 7], [0, 8]],
        "counts": [9, 9, 2, 2, 2, 2, 1], "total": 27}
    # the CLI's flame graph (names only, binaries merged) counts the same stacks in the same order
    _, cli_rows = store.query_named("flamegraph_cpu", edge_store.first)
    folded = [(";".join(got["frames"][f] for f in stack), count)
              for stack, count in zip(got["stacks"], got["counts"], strict=True)]
    assert [(";".join(functions), count) for functions, count in cli_rows] == [
        ("main;run;io", 18), *folded[2:]]
    gpu = ids_graph(store, "gpu", {"since": edge_store.first["since"], "until": edge_store.second["until"]})
    assert (gpu["frames"], gpu["stacks"], gpu["counts"]) == (
        ["main", "gemm_kernel", "[unknown 0x0b]", "[unknown 0x0abc]"], [[0, 1], [0, 2, 3]], [2**40, 5])
    empty = ids_graph(store, "cpu", {"since": edge_store.first["since"] - timedelta(days=1),
                                     "until": edge_store.first["since"]})
    assert empty == {"frames": [], "binaries": [], "frame_binary": [], "languages": [], "frame_language": [],
                     "stacks": [], "counts": [], "total": 0}


def test_flame_graph_roots_each_process_at_a_frame_of_its_own(edge_store):
    """Stacks merge within a process, never across: the same stacks sampled in another process (another node, pid
    or comm) are its own, under its own root frame; a process's frame is the first of each of its stacks."""
    store, t0 = edge_store.store, edge_store.first["since"]
    store.insert("cpu_samples", [[t0, "n2", 10, "train", "", 0x100, 7], [t0, "n1", 10, "train2", "", 0x101, 1],
                                 [t0, "n1", 12, "", "", 0x05, 3]],
                 ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    got = ids_graph(store, "cpu", edge_store.first, processes=True)
    folded = [(";".join(got["frames"][f] for f in stack), n) for stack, n in zip(got["stacks"], got["counts"],
                                                                                strict=True)]
    # by value, then functions, then binaries (io in app before io in libc.so.6): the roots order equal values
    assert folded == [
        ("train (pid 10 on n1);main;run;io", 9), ("train (pid 10 on n1);main;run;io", 9),
        ("train (pid 10 on n2);main;run;io", 7), ("pid 12 on n1;[unknown stack 0x05]", 3),
        ("train (pid 10 on n1);[unknown stack 0x05]", 2),
        ("train (pid 10 on n1);[unknown stack 0xfffffffffffffffe]", 2),
        ("train (pid 10 on n1);main", 2), ("train (pid 10 on n1);main;[unknown 0x0b];[unknown 0x0abc]", 2),
        ("train (pid 10 on n1);main;gemm_kernel", 1), ("train2 (pid 10 on n1);main;run;io", 1)]
    language = {got["frames"][f]: got["languages"][k] for f, k in enumerate(got["frame_language"])}
    assert [name for name, lang in language.items() if lang == "process"] == [
        "train (pid 10 on n1)", "train (pid 10 on n2)", "pid 12 on n1", "train2 (pid 10 on n1)"]
    one = ids_graph(store, "cpu", {**edge_store.first, "node": "n2"}, processes=True)
    assert plain(model.flamegraph_of_ids(model.StackIds.from_arrow(store.query_named_arrow(
        "flamegraph_ids_cpu", {**edge_store.first, "node": "n2"})), store.query_named(
        "flamegraph_names_cpu", {**edge_store.first, "node": "n2"})[1], one_node=True))["frames"][0] == "train (pid 10)"
    assert one["frames"][0] == "train (pid 10 on n2)"


def test_flame_graph_diff_from_ids(edge_store):
    got = ids_graph(edge_store.store, "cpu", edge_store.first, edge_store.second)
    # the first range's stacks in its order, then the baseline's others in theirs (io;main before main;idle)
    assert got["stacks"] == [[0, 1, 2], [0, 1, 3], [4], [5], [0], [0, 6, 7], [0, 8], [3, 0], [0, 9]]
    assert got["frames"][9] == "idle" and got["frame_binary"][9] == 0
    assert (got["counts"], got["total"]) == ([9, 9, 2, 2, 2, 2, 1, 0, 0], 27)
    assert (got["base_counts"], got["base_total"]) == ([0, 0, 0, 0, 7, 0, 0, 3, 3], 13)


def test_big_flame_graph_is_the_sql_grouping_in_every_encoding(store):
    """3,000 random stacks over frame ids that often share names: the answer equals model.flamegraph of the rows
    that grouping by (functions, binaries) and ordering as flamegraph_cpu does give, computed here in Python; the
    same in zstd, gzip and uncompressed."""
    rng = random.Random(11)
    t0 = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(hours=1)
    functions = ["main", "run", "step", "é_step", "z", "a", "ab", "[unknown 0x01]"]
    binaries = ["app", "libc.so.6", "libé.so", "[gpu]"]
    frame_ids = [rng.getrandbits(64) for _ in range(60)]
    named = {f: (rng.choice(functions), rng.choice(binaries)) for f in frame_ids[:50]}  # the last 10 undefined
    stacks = {rng.getrandbits(64): [rng.choice(frame_ids) for _ in range(rng.randint(0, 12))] for _ in range(3000)}
    counts = {s: rng.choice([1, 2, 3, rng.randint(1, 10**6)]) for s in stacks}
    store.insert("frames", [[f, fn, b, "NATIVE", t0] for f, (fn, b) in named.items()],
                 ["frame_id", "function", "binary", "kind", "last_seen"])
    defined = {s for s in stacks if rng.random() < 0.95}
    store.insert("stacks", [[s, stacks[s], t0] for s in defined], ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", [[t0, "n1", 1, "c", "", s, n] for s, n in counts.items()],
                 ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    grouped: dict[tuple, int] = {}
    for s, n in counts.items():
        frames = [named.get(f, (f"[unknown 0x{model.ch_hex(f)}]", "")) for f in stacks[s]] if s in defined else []
        # every stack under its process's frame (the API's answer is for all nodes: the node is named)
        frames = [("c (pid 1 on n1)", ""), *(frames or [(f"[unknown stack 0x{model.ch_hex(s)}]", "")])]
        key = (tuple(f for f, _ in frames), tuple(b for _, b in frames))
        grouped[key] = grouped.get(key, 0) + n
    # ClickHouse compares arrays of strings element by element, bytewise, a prefix first: as Python compares these
    ordered = sorted(grouped.items(), key=lambda kv: (-kv[1], [f.encode() for f in kv[0][0]],
                                                      [b.encode() for b in kv[0][1]]))
    expected = model.flamegraph([(list(f), list(b), n) for (f, b), n in ordered])
    assert len(expected["stacks"]) > 2000 and len(expected["stacks"]) < len(stacks)  # some merged
    server = serve_api(store, "127.0.0.1", 0)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            params = {"since": int(t0.timestamp()), "until": int(t0.timestamp()) + 1}
            for asked, encoding, unpack in (("gzip, deflate, br, zstd", "zstd", zstd.decompress),
                                            ("gzip, deflate", "gzip", gzip.decompress), ("identity", None, bytes)):
                with http.stream("GET", "/api/flamegraph", params=params,
                                 headers={"Accept-Encoding": asked}) as response:
                    wire = b"".join(response.iter_raw())
                assert response.headers.get("content-encoding") == encoding
                body = json.loads(unpack(wire))
                assert {k: body[k] for k in expected} == expected, asked
    finally:
        server.stop()
