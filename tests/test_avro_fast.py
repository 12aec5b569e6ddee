"""The compiled Avro reader (schemas/avro_read.c) gives exactly fastavro's values, types and key order for every
schema, and on hostile bytes it either gives fastavro's value or leaves the message to fastavro: it never accepts a
body that single_object's fastavro path calls corrupt."""

from __future__ import annotations

import io
import os

import fastavro
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from schemas import avro_fast, single_object
from schemas.cpu_batch_writer import long_bytes
from tests.fuzz.records import EDITS, mutate, record_of

FUZZ = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REGISTRY = single_object.default_registry()
SCHEMAS = [name.split(".", 1)[1] for name in REGISTRY.names()]


def same(a: object, b: object) -> bool:
    """Equal values of the same types all the way down (True is not 1 here), dicts in the same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):  # a column of ints: int64 both, the same values
        return a.dtype == b.dtype == np.int64 and np.array_equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def by_fastavro(data: bytes, schema: single_object.SchemaVersion) -> object:
    """single_object's fastavro path: the record, or DecodeError."""
    buf = io.BytesIO(data)
    buf.seek(single_object.HEADER_LEN)
    try:
        record = fastavro.schemaless_reader(buf, schema.parsed, schema.parsed)
    except Exception as exc:
        raise single_object.DecodeError(str(exc)) from None
    if buf.tell() != len(data):
        raise single_object.DecodeError("trailing bytes")
    if schema.ints_fit is not None and not schema.ints_fit(record):
        raise single_object.DecodeError("int beyond 32 bits")
    return record


def compiled(codec):
    """`codec`, or a skip naming why the compiled codec is unavailable (a failure in CI, where gcc must build it)."""
    if codec is None:
        why = f"the compiled Avro codec is unavailable: {avro_fast.unavailable()}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return codec


def test_the_compiled_codec_is_built_for_every_schema():
    for name in REGISTRY.names():
        compiled(single_object.fast_reader(REGISTRY.latest(name)))
        compiled(single_object.fast_writer(REGISTRY.latest(name)))


@pytest.mark.parametrize("name", SCHEMAS)
def test_records_read_exactly_as_fastavro_reads_them_and_mutations_never_pass_where_fastavro_fails(name):
    schema = REGISTRY.latest(f"fleetprof.{name}")
    fast = compiled(single_object.fast_reader(schema))

    @FUZZ
    @given(record_of(name), EDITS)
    def check(record, edits):
        data = single_object.encode(name, record)
        want = by_fastavro(data, schema)
        assert same(fast(data, single_object.HEADER_LEN), want)
        mutated = mutate(data, edits)
        try:
            got = fast(mutated, single_object.HEADER_LEN)
        except ValueError:
            return  # left to fastavro
        assert same(got, by_fastavro(mutated, schema))

    check()


TAILS = {"GpuLaunch": "user_addrs", "GpuKernel": "kernel_name"}  # where a batch reader's cached tail begins


@pytest.mark.parametrize("tail", [False, True], ids=["whole", "cached-tail"])
@pytest.mark.parametrize("name", ["GpuLaunch", "GpuKernel"])
def test_a_batch_reads_each_body_as_one_read_does_and_none_where_it_refuses(name, tail):
    schema = REGISTRY.latest(f"fleetprof.{name}")
    one = compiled(single_object.fast_reader(schema))
    tail_from = [f["name"] for f in schema.parsed["fields"]].index(TAILS[name]) if tail else None
    # 7 tails kept, of at most 64 bytes: the fuzzed bodies' tails fall on both sides of that
    each = compiled(avro_fast.batch_reader_for(schema.parsed, tail_from, max_tails=7, max_tail_bytes=64))
    datas: list = []

    @settings(FUZZ, max_examples=30)
    @given(record_of(name), EDITS)
    def collect(record, edits):
        data = single_object.encode(name, record)
        # the body again after a truncated and an overlong copy of it: neither may leave a wrong tail behind
        datas.extend([data, mutate(data, edits), data[:-1], data + b"\0", data])

    collect()
    datas += [b"", b"short", bytearray(datas[0]), None]  # too short for the header; not bytes: None, never a crash

    def single(data: object) -> object:
        if not isinstance(data, bytes) or len(data) < single_object.HEADER_LEN:
            return None
        try:
            return one(data, single_object.HEADER_LEN)
        except ValueError:
            return None

    got = each(datas, single_object.HEADER_LEN)
    assert len(got) == len(datas) and all(same(g, single(d)) for g, d in zip(got, datas, strict=True))
    assert sum(g is None for g in got) >= 30 and sum(g is not None for g in got) >= 30
    again = each(datas, single_object.HEADER_LEN)  # now mostly from the cache (7 tails kept: cleared on the way)
    assert all(same(g, single(d)) for g, d in zip(again, datas, strict=True))
    if tail:  # a body read again shares its tail's objects with the first read (where the tail is still kept)
        roomy = avro_fast.batch_reader_for(schema.parsed, tail_from, max_tails=1000, max_tail_bytes=1 << 30)
        got = roomy(datas, single_object.HEADER_LEN)
        pairs = [(got[i], got[i + 4]) for i in range(0, 150, 5) if got[i] is not None]
        shared = [a[TAILS[name]] is b[TAILS[name]] for a, b in pairs]
        assert len(pairs) >= 25 and all(shared)


def test_a_cached_tail_is_shared_and_the_cache_stays_within_its_bound():
    schema = REGISTRY.latest("fleetprof.GpuLaunch")
    fields = [f["name"] for f in schema.parsed["fields"]]
    each = compiled(avro_fast.batch_reader_for(schema.parsed, fields.index("user_addrs"), max_tails=2))
    base = {"node": "n", "pid": 1, "tid": 1, "process_start_ns": 5, "time_ns": 10, "correlation_id": 1,
            "callback_id": 2, "api_name": "cudaLaunchKernel", "weight": 1, "nvtx_range": "", "graph": False,
            "identity_id": 0, "user_addrs": [1 << 40, 2 << 40], "mappings": [], "code_objects": [], "simulated": False}
    stacks = [[1 << 40, k] for k in range(4)]
    datas = [single_object.encode("GpuLaunch", {**base, "time_ns": t, "user_addrs": stacks[t % 4]}) for t in range(12)]
    got = each(datas, single_object.HEADER_LEN)
    assert [r["time_ns"] for r in got] == list(range(12)) and [r["user_addrs"] for r in got] == [
        stacks[t % 4] for t in range(12)]
    # two tails kept: the third distinct one clears them, so with four in turn each is read again, none shared
    assert not any(got[t]["user_addrs"] is got[t - 4]["user_addrs"] for t in range(4, 12))
    one = compiled(avro_fast.batch_reader_for(schema.parsed, fields.index("user_addrs"), max_tails=100))
    got = one(datas, single_object.HEADER_LEN)
    assert all(got[t]["user_addrs"] is got[t % 4]["user_addrs"] for t in range(12))
    assert all(got[t]["mappings"] is got[t % 4]["mappings"] for t in range(12))  # every value of the tail
    # a tail over max_tail_bytes (a launch carrying its process's mappings) is read every time and never kept
    mapping = {"start": 1 << 40, "limit": 2 << 40, "file_offset": 0, "path": "/usr/lib/libcuda.so.1" * 4,
               "build_id": "ab" * 20}
    big = single_object.encode("GpuLaunch", {**base, "mappings": [mapping] * 8})
    small = single_object.encode("GpuLaunch", base)
    tails: dict = {}
    read_each = avro_fast._load().read_each
    tree = avro_fast.type_tree(schema.parsed)
    got = read_each(tree, [big, small, big, small], single_object.HEADER_LEN, fields.index("user_addrs"), tails, 100,
                    len(small) - single_object.HEADER_LEN)
    assert [r["mappings"] for r in got] == [[mapping] * 8, [], [mapping] * 8, []]
    assert got[0]["mappings"] is not got[2]["mappings"] and got[1]["mappings"] is got[3]["mappings"]
    assert len(tails) == 1


def as_columns(record: dict, fields: tuple[str, ...], names: dict[str, list[str]],
               ints: dict[str, frozenset[str]]) -> dict:
    """`record` with each of its arrays of records `fields` as {item field: column}: an int or long field's an
    int64 array, any other's a list."""
    def column(f: str, n: str) -> list | np.ndarray:
        values = [item[n] for item in record[f]]
        return np.array(values, dtype=np.int64) if n in ints[f] else values

    return {**record, **{f: {n: column(f, n) for n in names[f]} for f in fields}}


@pytest.mark.parametrize("name, fields", [("CpuSamples", ("samples",)), ("GpuSamples", ("samples",)),
                                          ("GpuMetrics", ("devices", "processes"))])
def test_arrays_read_as_columns_hold_what_their_records_hold_and_refuse_what_they_refuse(name, fields):
    schema = REGISTRY.latest(f"fleetprof.{name}")
    one = compiled(single_object.fast_reader(schema))
    columns = compiled(avro_fast.columns_reader_for(schema.parsed, fields))
    names = {f: single_object._item_fields(schema.parsed, f) for f in fields}
    ints = {f: single_object._item_int_fields(schema.parsed, f) for f in fields}
    assert ints["samples" if "samples" in ints else "devices"]  # the arrays hold int or long fields to read so
    seen = {"empty": 0, "refused": 0}

    @settings(FUZZ, max_examples=60)
    @given(record_of(name), EDITS)
    def check(record, edits):
        data = single_object.encode(name, record)
        seen["empty"] += not record[fields[0]]
        assert same(columns(data, single_object.HEADER_LEN), as_columns(one(data, single_object.HEADER_LEN),
                                                                       fields, names, ints))
        for body in (mutate(data, edits), data[:-1], data + b"\0"):
            try:
                want = as_columns(one(body, single_object.HEADER_LEN), fields, names, ints)
            except ValueError:
                seen["refused"] += 1
                with pytest.raises(ValueError):
                    columns(body, single_object.HEADER_LEN)
                continue
            assert same(columns(body, single_object.HEADER_LEN), want)

    check()
    assert seen["empty"] >= 1 and seen["refused"] >= 60  # an empty array gives empty columns; bad bodies refused
    assert avro_fast.columns_reader_for(schema.parsed, (*fields, "node")) is None  # not an array of records


def lists(columns: dict) -> dict:
    """Columns as lists, each int or long field's checked to be an int64 array first."""
    ints = {"pid", "identity_id", "stack_id", "count"}
    assert all(isinstance(v, np.ndarray) and v.dtype == np.int64 for k, v in columns.items() if k in ints)
    assert all(isinstance(v, list) for k, v in columns.items() if k not in ints)
    return {k: v.tolist() if k in ints else v for k, v in columns.items()}


def test_decoding_as_columns_gives_the_same_columns_on_every_path(monkeypatch):
    record = {"node": "n", "window_start_ns": 10**18, "window_ns": 10**10, "frames": [], "stacks": [],
              "samples": [{"pid": 1, "comm": "a", "container_id": "", "identity_id": -5, "stack_id": -2, "count": 3},
                          {"pid": 2, "comm": "b", "container_id": "k", "identity_id": 0, "stack_id": 9, "count": 1}],
              "simulated": False, "frequency_hz": 19}
    want = {"pid": [1, 2], "comm": ["a", "b"], "container_id": ["", "k"], "identity_id": [-5, 0],
            "stack_id": [-2, 9], "count": [3, 1]}
    columns = {"fleetprof.CpuSamples": ("samples",)}
    data = single_object.encode("CpuSamples", record)
    compiled(single_object.fast_reader(REGISTRY.latest("fleetprof.CpuSamples")))
    assert lists(single_object.decode(data, columns=columns)[1]["samples"]) == want  # the compiled reader
    monkeypatch.setattr(single_object, "_COLUMNS_READERS", {})
    monkeypatch.setattr(avro_fast, "columns_reader_for", lambda schema, fields: None)
    assert lists(single_object.decode(data, columns=columns)[1]["samples"]) == want  # fastavro, then as columns
    empty = single_object.decode(single_object.encode("CpuSamples", record | {"samples": []}), columns=columns)
    assert lists(empty[1]["samples"]) == {name: [] for name in want}
    v2 = single_object.encode_as(REGISTRY.version("fleetprof.CpuSamples", 2),  # an older writer: read as the newest
                                 {**record, "samples": [{k: v for k, v in s.items() if k != "identity_id"}
                                                        for s in record["samples"]]})
    assert lists(single_object.decode(v2, columns=columns)[1]["samples"]) == want | {"identity_id": [0, 0]}
    with pytest.raises(single_object.DecodeError):
        single_object.decode(data[:-3], columns=columns)


def test_a_string_repeated_from_the_row_before_reads_as_itself():
    # the compiled reader gives the row before's string object again where the bytes are the same: only there
    comms = ["worker", "worker", "bee", "worker", "", "", "ab", "a", "\u00e9t\u00e9", "\u00e9t\u00e9", "\u00e9t\u00e8"]
    record = {"node": "n", "window_start_ns": 10**18, "window_ns": 10**10, "frames": [], "stacks": [],
              "samples": [{"pid": i, "comm": c, "container_id": "k" if i % 3 else "", "identity_id": 0,
                           "stack_id": i, "count": 1} for i, c in enumerate(comms)],
              "simulated": False, "frequency_hz": 19}
    compiled(single_object.fast_reader(REGISTRY.latest("fleetprof.CpuSamples")))
    got = single_object.decode(single_object.encode("CpuSamples", record),
                               columns={"fleetprof.CpuSamples": ("samples",)})[1]["samples"]
    assert got["comm"] == comms and got["container_id"] == ["k" if i % 3 else "" for i in range(len(comms))]
    assert got["comm"][1] is got["comm"][0] and got["comm"][3] is not got["comm"][1]
    assert got["pid"].tolist() == list(range(len(comms)))


@pytest.mark.parametrize("body, why", [
    (long_bytes(1) + b"ab", "trailing bytes"),
    (b"\x80" * 10 + b"\x01", "varint beyond 64 bits"),
    (long_bytes(-3) + b"abc", "negative length"),
    (long_bytes(4) + b"\xff\xfe\xfd\xfc", "invalid UTF-8"),
    (long_bytes(9) + b"abc", "length beyond the body"),
])
def test_the_compiled_reader_refuses_what_it_is_unsure_of(body, why):
    bytes_schema = single_object.SchemaVersion("t.Bytes", 1, {"type": "string"}, b"\0" * 8)
    read = compiled(avro_fast.reader_for(bytes_schema.parsed))
    with pytest.raises(ValueError):
        read(b"h" * single_object.HEADER_LEN + body, single_object.HEADER_LEN)


@pytest.mark.parametrize("kind, body, want", [
    ("int", long_bytes(2**31 - 1), 2**31 - 1), ("int", long_bytes(-(2**31)), -(2**31)),
    ("int", long_bytes(2**31), None),
    ("long", long_bytes(2**63 - 1), 2**63 - 1), ("long", long_bytes(-(2**63)), -(2**63)),
    ("boolean", b"\x01", True), ("boolean", b"\x00", False), ("boolean", b"\x02", None),
    ("double", b"\0\0\0\0\0\0\xf0\x3f", 1.0), ("float", b"\0\0\xc0\x3f", 1.5),
])
def test_edges_of_the_primitive_types(kind, body, want):
    read = compiled(avro_fast.reader_for(kind))
    if want is None:
        with pytest.raises(ValueError):
            read(body, 0)
    else:
        assert same(read(body, 0), want)


def test_a_recursive_or_logical_schema_is_left_to_fastavro():
    recursive = fastavro.parse_schema({"type": "record", "name": "t.Node", "fields": [
        {"name": "next", "type": ["null", "t.Node"]}]}, named_schemas={})
    logical = fastavro.parse_schema({"type": "long", "logicalType": "timestamp-millis"})
    assert avro_fast.reader_for(recursive) is None and avro_fast.reader_for(logical) is None


def by_fastavro_writer(record: object, schema: single_object.SchemaVersion) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema.parsed, record)
    return single_object.MARKER + schema.fingerprint + buf.getvalue()


@pytest.mark.parametrize("name", SCHEMAS)
def test_records_are_written_byte_for_byte_as_fastavro_writes_them(name):
    schema = REGISTRY.latest(f"fleetprof.{name}")
    write = compiled(single_object.fast_writer(schema))

    @FUZZ
    @given(record_of(name))
    def check(record):
        assert write(record, single_object.MARKER + schema.fingerprint) == by_fastavro_writer(record, schema)

    check()


def test_values_the_writer_does_not_take_as_is_are_left_to_fastavro():
    """fastavro's coercions (an int for a double, a tuple for an array, True for a long) give fastavro's bytes
    through encode_as; the compiled writer refuses each of them. A missing field is written as its default, as
    fastavro writes it."""
    schema = single_object.SchemaVersion("t.R", 1, fastavro.parse_schema({"type": "record", "name": "t.R", "fields": [
        {"name": "d", "type": "double"}, {"name": "n", "type": "long"}, {"name": "xs", "type": {"type": "array",
                                                                                              "items": "long"}},
        {"name": "s", "type": "string", "default": "x"}]}, named_schemas={}), b"\1" * 8)
    write = compiled(avro_fast.writer_for(schema.parsed))
    plain = {"d": 1.5, "n": 3, "xs": [1, 2], "s": "é"}
    defaulted = {"d": 1.5, "n": -3, "xs": []}
    for record in (plain, defaulted):
        assert write(record, b"") == by_fastavro_writer(record, schema)[single_object.HEADER_LEN:]
    for coerced in ({"d": 1, "n": 3, "xs": [1], "s": ""}, {"d": 1.0, "n": True, "xs": [1], "s": ""},
                    {"d": 1.0, "n": 3, "xs": (1, 2), "s": ""}):
        with pytest.raises(ValueError):
            write(coerced, b"")
        assert single_object.encode_as(schema, coerced) == by_fastavro_writer(coerced, schema)
    missing = {"n": 3, "xs": [], "s": ""}  # d has no default: fastavro's error
    with pytest.raises(ValueError, match="refuse|without a default"):
        write(missing, b"")
    with pytest.raises(ValueError, match="no value and no default for d"):
        single_object.encode_as(schema, missing)
