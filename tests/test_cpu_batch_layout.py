"""The CpuStackBatch layout of the fast writer and the columnar reader comes from the schema file, field by field; a
schema with other fields, in another order, is written and read by its own layout exactly as fastavro does; and a
schema the fast paths cannot handle fails at derivation, naming the field."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import single_object
from schemas.cpu_batch_layout import LAYOUT, Field, LayoutError, Record, derive
from schemas.cpu_batch_reader import CpuBatchReader
from schemas.cpu_batch_writer import CpuBatchWriter
from schemas.packed_stacks import ADDRESS_COLUMNS, NUMBER_COLUMNS, PackedStacks

V1 = json.loads((single_object.SCHEMA_DIR / "cpu_stack_batch.v1.avsc").read_text())
V3 = json.loads((single_object.SCHEMA_DIR / "cpu_stack_batch.v3.avsc").read_text())  # the newest


def _expected(fields: list[dict], last: str | None) -> list[tuple]:
    """(name, kind, item layout) per field of the schema file, as the layout should list them."""
    out = []
    for f in fields:
        t = f["type"]
        if isinstance(t, str):
            out.append((f["name"], t, None))
        elif f is fields[-1] and last == "stacks":
            out.append((f["name"], "stacks", None))
        else:
            items = t["items"]["fields"]
            out.append((f["name"], "array", _expected(items, "stacks" if f is fields[-1] else None)))
    return out


def _listed(record: Record) -> list[tuple]:
    return [(f.name, f.kind, None if f.items is None else _listed(f.items)) for f in record.fields]


def test_the_layout_is_the_schema_file_field_by_field():
    assert LAYOUT.schema is single_object.default_registry().latest("CpuStackBatch")
    assert LAYOUT.schema.fingerprint == single_object.crc64_avro(V3)
    assert _listed(LAYOUT.batch) == _expected(V3["fields"], "processes")
    processes = V3["fields"][-1]["type"]["items"]
    assert _listed(LAYOUT.process) == _expected(processes["fields"], "stacks")
    stack = processes["fields"][-1]["type"]["items"]["fields"]
    assert [(f.name, f.kind) for f in LAYOUT.stack] == [
        (f["name"], "addresses" if isinstance(f["type"], dict) else f["type"]) for f in stack]
    assert {f.name: (f.column, f.lens_column) for f in LAYOUT.stack} == {
        **{n: (c, "") for n, c in NUMBER_COLUMNS.items()}, **ADDRESS_COLUMNS}
    assert LAYOUT.stack_gaps() == (1, 0, 1)  # tid | user_addrs | | kernel_addrs | count
    assert (LAYOUT.batch.min_bytes, LAYOUT.process.min_bytes, LAYOUT.process.fields[-3].items.min_bytes,
            LAYOUT.process.fields[-2].items.min_bytes) == (7, 9, 5, 3)


def _variant() -> dict:
    """v1 with added fields of every scalar kind, mapping longs no longer first, and StackCount reordered."""
    schema = copy.deepcopy(V1)
    batch = schema["fields"]
    batch.insert(1, {"name": "agent_version", "type": "string"})
    process = batch[-1]["type"]["items"]["fields"]
    process.insert(1, {"name": "start_ns", "type": "long"})
    process.insert(-1, {"name": "exited", "type": "boolean"})
    mapping = process[-3]["type"]["items"]["fields"]
    mapping.insert(0, mapping.pop(3))  # path first
    mapping.append({"name": "inode", "type": "int"})
    stack = process[-1]["type"]["items"]["fields"]
    stack[:] = [stack[3], stack[2], stack[0], stack[1]]  # count, kernel_addrs, tid, user_addrs
    return schema


def _variant_registry() -> single_object.SchemaRegistry:
    reg = single_object.SchemaRegistry()
    reg.register(_variant(), 9)
    return reg


VARIANT = derive(_variant_registry().latest("CpuStackBatch"))
I64 = st.integers(-(2**63), 2**63 - 1)
INT = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(max_size=6)
ADDRS = st.lists(st.one_of(I64, st.sampled_from([0, -1, 2**63 - 1])), max_size=5)
stack_st = st.fixed_dictionaries({"tid": INT, "user_addrs": ADDRS, "kernel_addrs": ADDRS, "count": I64})
mapping_st = st.fixed_dictionaries({"start": I64, "limit": I64, "file_offset": I64, "path": TEXT, "build_id": TEXT,
                                    "inode": INT})
process_st = st.fixed_dictionaries({"pid": INT, "start_ns": I64, "comm": TEXT, "exe": TEXT, "cgroup": TEXT,
                                    "container_id": TEXT, "mappings": st.lists(mapping_st, max_size=3),
                                    "exited": st.booleans(), "stacks": st.lists(stack_st, max_size=4)})
batch_st = st.fixed_dictionaries({"node": TEXT, "agent_version": TEXT, "window_start_ns": I64, "window_ns": I64,
                                  "frequency_hz": INT, "kernel_build_id": TEXT, "simulated": st.booleans(),
                                  "processes": st.lists(process_st, max_size=3)})


def test_the_variant_layout_follows_its_schema():
    assert [f.name for f in VARIANT.batch.fields][:2] == ["node", "agent_version"]
    assert VARIANT.process.fields[-2] == Field("exited", "boolean")
    assert VARIANT.process.fields[-3].items.leading_longs() == ()
    assert LAYOUT.process.fields[-3].items.leading_longs() == ("start", "limit", "file_offset")
    assert [f.name for f in VARIANT.stack] == ["count", "kernel_addrs", "tid", "user_addrs"]
    assert VARIANT.stack_gaps() == (1, 1, 0)
    v1 = {"node": "n", "window_start_ns": 1, "window_ns": 2, "frequency_hz": 3, "kernel_build_id": "k",
          "simulated": False, "processes": []}
    with pytest.raises(single_object.DecodeError, match="not a CpuStackBatch v9"):
        CpuBatchReader(VARIANT).read(single_object.encode("CpuStackBatch", v1))


@given(batch_st)
@settings(max_examples=150, deadline=None)
def test_a_variant_schema_is_written_and_read_by_its_own_layout(batch):
    reg = _variant_registry()
    data = single_object.encode("CpuStackBatch", batch, registry=reg)
    writer, reader = CpuBatchWriter(VARIANT), CpuBatchReader(VARIANT)
    assert writer.encode(batch) == [data]
    packed = {**batch, "processes": [{**p, "stacks": PackedStacks.from_records(p["stacks"])}
                                     for p in batch["processes"]]}
    assert writer.encode(packed) == [data]
    for fast in (True, False):
        rec = reader.walk(data, fast)
        assert {**rec, "processes": [{**p, "stacks": p["stacks"].records()} for p in rec["processes"]]} == batch


def _edited(edit) -> single_object.SchemaVersion:
    schema = copy.deepcopy(V1)
    edit(schema["fields"], schema["fields"][-1]["type"]["items"]["fields"])
    reg = single_object.SchemaRegistry()
    return reg.register(schema, 2)


def _stack_fields(process: list[dict]) -> list[dict]:
    return process[-1]["type"]["items"]["fields"]


@pytest.mark.parametrize("edit, reason", [
    (lambda b, p: b.insert(1, {"name": "labels", "type": {"type": "map", "values": "string"}}),
     "CpuStackBatch.labels has type"),
    (lambda b, p: b.insert(1, {"name": "host", "type": ["null", "string"]}), "CpuStackBatch.host has type"),
    (lambda b, p: b.append({"name": "agent", "type": "string"}), "CpuStackBatch.agent comes last"),
    (lambda b, p: p.insert(-1, {"name": "unit", "type": "string"}), "processes.unit is a string right before"),
    (lambda b, p: p[-2]["type"]["items"]["fields"].append({"name": "tags", "type": {"type": "array", "items": {
        "type": "record", "name": "Tag", "fields": [{"name": "k", "type": "string"}]}}}),
     "processes.mappings.tags is an array inside an array item"),
    (lambda b, p: _stack_fields(p).pop(), "lacks the PackedStacks field(s) count"),
    (lambda b, p: _stack_fields(p).append({"name": "weight", "type": "long"}), "stacks.weight of type 'long' is not"),
    (lambda b, p: _stack_fields(p)[0].update(type="string"), "stacks.tid of type 'string' is not"),
])
def test_a_schema_the_fast_paths_cannot_handle_fails_naming_the_field(edit, reason):
    with pytest.raises(LayoutError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        derive(_edited(edit))
