"""The columnar CpuStackBatch decoder: the same record as the codec for any valid Avro (blocks, negative counts with
sizes, edge values), DecodeError and nothing else for truncated or corrupt bytes, fastavro for every other schema."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import avro_fast, single_object
from schemas.cpu_batch_layout import LAYOUT
from schemas.cpu_batch_reader import CpuBatchReader, _numpy_varints, decode_columnar, decode_cpu_batch_columnar
from schemas.cpu_batch_writer import encode_cpu_batches, long_bytes
from schemas.packed_stacks import PackedStacks
from simulate.synthetic_binaries import KERNEL_BUILD_ID
from simulate.synthetic_fleet import FREQUENCY_HZ, SyntheticFleet
from tests.elf_helpers import unavailable

NEXT_DIR = Path(__file__).parent / "schemas"  # a next version of the schemas
READER = CpuBatchReader(LAYOUT)
HEADER = single_object.MARKER + LAYOUT.schema.fingerprint
I64 = st.integers(-(2**63), 2**63 - 1)
EDGES = st.sampled_from([0, 1, -1, 63, 64, -64, -65, 2**31, 2**62, 2**63 - 1, -(2**63), -(2**63) + 1,
                         0xFFFFFFFF81000000 - 2**64, 0x7F0000001234])
ADDR = st.one_of(EDGES, I64, st.integers(0, 2**48))
INT = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(max_size=12)  # non-ASCII too: the decoder must keep its place after multi-byte characters


# ---- an Avro writer for CpuStackBatch v3 that can split every array into blocks, as other Avro writers may ----

def _string(s: str) -> bytes:
    b = s.encode()
    return long_bytes(len(b)) + b


def _array(items: list[bytes], rnd: random.Random | None) -> bytes:
    """Items in one block (what fastavro writes) or, with rnd, in random blocks, some with a negative count and
    their size in bytes."""
    out, i = [], 0
    while i < len(items):
        n = rnd.randint(1, len(items) - i) if rnd else len(items)
        body = b"".join(items[i:i + n])
        sized = rnd is not None and rnd.random() < 0.5
        out += [long_bytes(-n) + long_bytes(len(body)) if sized else long_bytes(n), body]
        i += n
    return b"".join(out) + b"\x00"


def write_batch(batch: dict, rnd: random.Random | None = None) -> bytes:
    def stack(s: dict) -> bytes:
        return (long_bytes(s["tid"]) + _array([long_bytes(a) for a in s["user_addrs"]], rnd)
                + _array([long_bytes(a) for a in s["kernel_addrs"]], rnd) + long_bytes(s["count"]))

    def mapping(m: dict) -> bytes:
        return b"".join([long_bytes(m["start"]), long_bytes(m["limit"]), long_bytes(m["file_offset"]),
                         _string(m["path"]), _string(m["build_id"])])

    def code(c: dict) -> bytes:
        return _string(c["qualname"]) + _string(c["file"]) + long_bytes(c["first_line"])

    def process(p: dict) -> bytes:
        return b"".join([long_bytes(p["pid"]), *(_string(p[k]) for k in ("comm", "exe", "cgroup", "container_id")),
                         long_bytes(p.get("identity_id", 0)), _array([mapping(m) for m in p["mappings"]], rnd),
                         _array([code(c) for c in p["code_objects"]], rnd),
                         _array([stack(s) for s in p["stacks"]], rnd)])

    return b"".join([HEADER, _string(batch["node"]), long_bytes(batch["window_start_ns"]),
                     long_bytes(batch["window_ns"]), long_bytes(batch["frequency_hz"]),
                     _string(batch["kernel_build_id"]), bytes([batch["simulated"]]),
                     _array([process(p) for p in batch["processes"]], rnd)])


stacks_st = st.fixed_dictionaries({"tid": INT, "user_addrs": st.lists(ADDR, max_size=8),
                                   "kernel_addrs": st.lists(ADDR, max_size=4), "count": I64})
mapping_st = st.fixed_dictionaries({"start": ADDR, "limit": ADDR, "file_offset": I64, "path": TEXT,
                                    "build_id": TEXT})
code_st = st.fixed_dictionaries({"qualname": TEXT, "file": TEXT, "first_line": INT})
process_st = st.fixed_dictionaries({"pid": INT, "comm": TEXT, "exe": TEXT, "cgroup": TEXT, "container_id": TEXT,
                                    "identity_id": st.one_of(st.just(0), I64),
                                    "mappings": st.lists(mapping_st, max_size=3),
                                    "code_objects": st.lists(code_st, max_size=2),
                                    "stacks": st.lists(stacks_st, max_size=6)})
batch_st = st.fixed_dictionaries({"node": TEXT, "window_start_ns": I64, "window_ns": I64, "frequency_hz": INT,
                                  "kernel_build_id": TEXT, "simulated": st.booleans(),
                                  "processes": st.lists(process_st, max_size=4)})


def as_records(rec: dict) -> dict:
    """The columnar record with PackedStacks turned back into StackCount dicts."""
    procs = []
    for p in rec["processes"]:
        assert isinstance(p["stacks"], PackedStacks)
        assert all(getattr(p["stacks"], c).dtype == np.int64 for c in ("tids", "counts", "user_addrs", "user_lens",
                                                                        "kernel_addrs", "kernel_lens"))
        procs.append({**p, "stacks": p["stacks"].records()})
    return {**rec, "processes": procs}


def columnar(data: bytes) -> dict:
    return as_records(decode_cpu_batch_columnar(data))


def test_the_reader_takes_the_v3_schema_file():
    schema = json.loads((single_object.SCHEMA_DIR / "cpu_stack_batch.v3.avsc").read_text())
    assert single_object.crc64_avro(schema) == LAYOUT.schema.fingerprint
    assert single_object.default_registry().latest("CpuStackBatch") is LAYOUT.schema


@given(batch_st)
@settings(max_examples=150, deadline=None)
def test_random_batches_decode_like_the_codec(batch):
    data = single_object.encode("CpuStackBatch", batch)
    assert write_batch(batch) == data  # the test writer writes what fastavro writes when it uses one block
    assert columnar(data) == single_object.decode(data)[1] == batch
    name, rec = decode_columnar(data)
    assert name == "fleetprof.CpuStackBatch" and as_records(rec) == batch


@given(batch_st, st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_arrays_in_many_blocks_with_and_without_sizes(batch, rnd):
    data = write_batch(batch, rnd)
    assert single_object.decode(data)[1] == batch
    assert columnar(data) == batch


def _synthetic_batch(seed: int, node_index: int) -> dict:
    fleet = SyntheticFleet(seed=seed)
    node = fleet.node(node_index)
    _, procs, _ = fleet.cpu_window(node, 1520)
    return {"node": node.name, "window_start_ns": 1_700_000_000 * 10**9, "window_ns": 10**10,
            "frequency_hz": FREQUENCY_HZ, "kernel_build_id": KERNEL_BUILD_ID, "simulated": True, "processes": procs}


def test_synthetic_fleet_batches_decode_like_the_codec():
    for seed, index in ((1, 0), (7, 3)):
        (data,) = encode_cpu_batches(_synthetic_batch(seed, index))
        assert columnar(data) == single_object.decode(data)[1]
        READER.walk(data, fast=True)  # what fleetprof writes takes the fast walk, not the general one


def test_deep_stacks_and_many_stacks():
    """Counts over 63 take two varint bytes; a process with thousands of stacks spans several decode chunks."""
    stacks = [{"tid": i, "user_addrs": list(range(0x7F0000000000, 0x7F0000000000 + 200 + i % 7)),
               "kernel_addrs": [-(2**63)] * (i % 3), "count": i} for i in range(3000)]
    proc = {"pid": 1, "comm": "c", "exe": "", "cgroup": "", "container_id": "", "identity_id": 0, "mappings": [],
            "code_objects": [], "stacks": stacks}
    batch = {"node": "n", "window_start_ns": 0, "window_ns": 1, "frequency_hz": 1, "kernel_build_id": "",
             "simulated": False, "processes": [proc, {**proc, "pid": 2, "stacks": []}, proc]}
    data = single_object.encode("CpuStackBatch", batch)
    assert columnar(data) == single_object.decode(data)[1] == batch
    READER.walk(data, fast=True)


def _small_messages() -> list[bytes]:
    maps = [{"start": 0x7F0000000000, "limit": 0x7F0000100000, "file_offset": 4096, "path": "/lib/libc.so.6",
             "build_id": "ab" * 20}]
    stacks = [{"tid": 7, "user_addrs": [0x7F0000000010, -1, 2**63 - 1], "kernel_addrs": [-(2**63)], "count": 3},
              {"tid": -8, "user_addrs": [], "kernel_addrs": [], "count": 1},
              {"tid": 9, "user_addrs": [1], "kernel_addrs": [0xFFFFFFFF81000000 - 2**64], "count": 2**40}]
    batch = {"node": "nœud-1", "window_start_ns": 10**18, "window_ns": 10**10, "frequency_hz": 19,
             "kernel_build_id": "k", "simulated": True,
             "processes": [{"pid": 5, "comm": "app", "exe": "/app", "cgroup": "", "container_id": "c",
                            "identity_id": -(2**63), "mappings": maps,
                            "code_objects": [{"qualname": "Model.forward", "file": "/m.py", "first_line": 10}],
                            "stacks": stacks},
                           {"pid": 6, "comm": "idle", "exe": "", "cgroup": "", "container_id": "", "identity_id": 0,
                            "mappings": [],
                            "code_objects": [], "stacks": []}]}
    return [single_object.encode("CpuStackBatch", batch), write_batch(batch, random.Random(3)),
            single_object.encode("CpuStackBatch", {**batch, "processes": []})]


def test_every_truncation_is_a_decode_error():
    for data in _small_messages():
        assert columnar(data) == single_object.decode(data)[1]
        for cut in range(len(data)):
            with pytest.raises(single_object.DecodeError) as err:
                decode_cpu_batch_columnar(data[:cut])
            assert "\n" not in str(err.value)
        with pytest.raises(single_object.DecodeError, match="1 trailing bytes"):
            decode_cpu_batch_columnar(data + b"\x00")


@given(st.sampled_from(_small_messages()), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255),
                                                              st.sampled_from(["set", "insert", "delete"])),
                                                    min_size=1, max_size=4))
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_corrupt_bytes_give_decode_error_or_the_codec_record(data, edits):
    corrupt = bytearray(data)
    for pos, byte, how in edits:
        i = single_object.HEADER_LEN + pos % (len(corrupt) - single_object.HEADER_LEN + 1)
        if how == "insert":
            corrupt[i:i] = bytes([byte])
        elif i < len(corrupt):
            if how == "set":
                corrupt[i] = byte
            else:
                del corrupt[i]
    try:
        rec = columnar(bytes(corrupt))
    except single_object.DecodeError as exc:
        assert "\n" not in str(exc)
        return
    # what decodes reads the same as through fastavro (which is laxer: it ignores block sizes, for one)
    assert rec == single_object.decode(bytes(corrupt))[1]


def _body(batch_fields: bytes, processes: bytes) -> bytes:
    return HEADER + batch_fields + processes


FIELDS = _string("n") + long_bytes(1) + long_bytes(2) + long_bytes(3) + _string("k") + b"\x01"
PROC_HEAD = long_bytes(7) + _string("c") * 4 + b"\x00" + b"\x00\x00"  # identity 0, no mappings, no code objects


def _one_stack(tid: bytes, count: bytes = long_bytes(1)) -> bytes:
    """One process with one stack (empty address arrays) whose tid is written as given."""
    return long_bytes(1) + PROC_HEAD + count + tid + b"\x00\x00\x02" + b"\x00" + b"\x00"


@pytest.mark.parametrize("processes, reason", [
    (long_bytes(2**62), "array count"),  # a bogus count is refused, not allocated
    (long_bytes(1) + PROC_HEAD + long_bytes(2**62) + b"\x00" * 8, "stack count"),
    (long_bytes(1) + PROC_HEAD + long_bytes(1) + long_bytes(1) + long_bytes(2**40) + b"\x00" * 8, "address count"),
    (_one_stack(b"\x80" * 10 + b"\x00"), "longer than 10 bytes"),
    (_one_stack(b"\xff" * 9 + b"\x02"), "over 64 bits"),
    (_one_stack(long_bytes(2**31)), "tid out of int range"),
    (_one_stack(long_bytes(1), count=long_bytes(-1) + long_bytes(99)), "stacks block size 99"),
    (long_bytes(1) + long_bytes(2**40) + _string("c") * 4 + b"\x00\x00\x00\x00", "int out of range"),
    (long_bytes(1) + long_bytes(7) + long_bytes(1) + b"\xff" + _string("c") * 3 + b"\x00\x00\x00\x00", "UTF-8"),
    (long_bytes(-1) + long_bytes(1000) + PROC_HEAD + b"\x00\x00", "array block size"),
])
def test_malformed_input_names_the_problem(processes, reason):
    data = _body(FIELDS, processes)
    with pytest.raises(single_object.DecodeError, match=reason) as err:
        decode_cpu_batch_columnar(data)
    assert "\n" not in str(err.value)


def test_a_boolean_is_zero_or_one():
    assert decode_cpu_batch_columnar(_body(FIELDS, b"\x00"))["simulated"] is True
    with pytest.raises(single_object.DecodeError, match="bad boolean"):
        decode_cpu_batch_columnar(_body(FIELDS[:-1] + b"\x02", b"\x00"))


def test_other_writers_and_records_go_through_fastavro():
    kernel = {"node": "n1", "pid": 42, "process_start_ns": 9, "correlation_id": 7, "start_ns": 100,
              "end_ns": 250, "device_id": 0,
              "stream_id": 13, "kernel_name": "k", "simulated": False}
    outside_graphs = {"activity": "KERNEL", "bytes": 0, "copy_kind": "", "memory_kinds": "", "graph_id": 0,
                      "graph_node_id": 0}
    assert decode_columnar(single_object.encode("GpuKernel", kernel)) == ("fleetprof.GpuKernel",
                                                                          {**kernel, **outside_graphs})
    with pytest.raises(single_object.DecodeError, match="not a CpuStackBatch v3"):
        decode_cpu_batch_columnar(single_object.encode("GpuKernel", kernel))
    reg = single_object.SchemaRegistry().load_dir()
    for path in sorted(NEXT_DIR.glob("*.avsc")):
        reg.register_file(path)
    batch = {"node": "n", "window_start_ns": 1, "window_ns": 2, "frequency_hz": 19, "kernel_build_id": "k",
             "simulated": True, "processes": [{"pid": 1, "comm": "c", "exe": "", "cgroup": "", "container_id": "",
                                               "mappings": [], "stacks": [{"tid": 1, "user_addrs": [-1, 5],
                                                                           "kernel_addrs": [], "count": 3}]}]}
    # v1 to v3 bytes read by a registry whose newest CpuStackBatch is v4: fastavro resolves the fields, no columns
    for version in (1, 2, 3):
        older = single_object.encode("CpuStackBatch", batch, version=version)
        _, rec = decode_columnar(older, registry=reg)
        assert rec["agent_version"] == "unknown" and rec["processes"][0]["stacks"][0]["user_addrs"] == [-1, 5]
    # a v4 writer: another fingerprint, read by fastavro
    v4 = single_object.encode("CpuStackBatch", {**batch, "agent_version": "3.0"}, registry=reg)
    _, rec = decode_columnar(v4, registry=reg)
    assert isinstance(rec["processes"][0]["stacks"], list) and rec["agent_version"] == "3.0"


def _varints_alike(data: bytes) -> None:
    """The compiled varint pass (avro_varints.c) gives the numpy passes' ends, bad runs, and values of the rest."""
    compiled = avro_fast.varints_reader()
    if compiled is None:
        unavailable(f"compiled codec unavailable: {avro_fast.unavailable()}")
    values, ends, bad = (np.frombuffer(b, dtype=np.int64) for b in compiled(data))
    want_values, want_ends, want_bad = _numpy_varints(data)
    assert ends.tolist() == want_ends.tolist() and bad.tolist() == want_bad.tolist()
    good = np.ones(len(values), dtype=bool)
    good[bad] = False
    assert values[good].tolist() == want_values[good].tolist()


@given(st.binary(max_size=400))
@settings(max_examples=400, deadline=None)
def test_the_compiled_varint_pass_reads_any_bytes_as_numpy_does(data):
    _varints_alike(data)


def test_the_compiled_varint_pass_at_64_bits_and_beyond():
    edges = [b"", b"\x00", b"\x7f", b"\x80", b"\x80" * 20]
    for n in range(1, 13):  # runs of n bytes, the last ending them with 0, 1, 2 or 0x7f (10 bytes: over 64 bits
        for last in (0, 1, 2, 0x7F):  # past 1), at every offset of an 8-byte word and at the buffer's end
            edges += [b"\xff" * (n - 1) + bytes([last]), b"\x01" * 5 + b"\xff" * (n - 1) + bytes([last]) + b"\x03"]
    for data in edges:
        _varints_alike(data)
    for data in _small_messages():
        _varints_alike(data)
    # the largest and smallest longs, as the codec writes them
    big = b"".join(long_bytes(v) for v in (-(1 << 63), (1 << 63) - 1, 0, -1, 1 << 62))
    values, _, bad = _numpy_varints(big)
    assert values.tolist() == [-(1 << 63), (1 << 63) - 1, 0, -1, 1 << 62] and not len(bad)
    _varints_alike(big)


def test_without_the_compiled_codec_the_numpy_passes_and_python_walk_read_the_same(monkeypatch):
    from schemas import cpu_batch_reader

    messages = _small_messages()
    compiled = [columnar(m) for m in messages]
    monkeypatch.setattr(cpu_batch_reader, "_compiled", lambda: (None, None))
    assert [columnar(m) for m in messages] == compiled == [single_object.decode(m)[1] for m in messages]
    for data in messages[:3]:
        with pytest.raises(single_object.DecodeError):
            decode_cpu_batch_columnar(data[:-3])


def test_processes_with_the_same_head_bytes_share_its_values():
    """A process whose fields before its stacks are the same bytes as in an earlier message gets that message's
    values (read-only by contract): its mappings list is the same object, and equal to the codec's."""
    data = _small_messages()[0]
    first, again = decode_cpu_batch_columnar(data), decode_cpu_batch_columnar(data)
    procs = [(a, b) for a, b in zip(first["processes"], again["processes"], strict=True) if a["mappings"]]
    assert procs and all(a["mappings"] is b["mappings"] for a, b in procs)
    assert as_records(again) == single_object.decode(data)[1]
