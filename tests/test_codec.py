"""The Avro contract: single-object framing, fingerprints, evolution, and clear errors on bad bytes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas import single_object, topics, wire

NEXT_DIR = Path(__file__).parent / "schemas"

KERNEL = {"node": "n1", "pid": 42, "process_start_ns": 5_000_000, "correlation_id": 7, "start_ns": 100,
          "end_ns": 250, "device_id": 0,
          "stream_id": 13, "kernel_name": "_Z6kernelPf", "simulated": True}
# what a GpuKernel v2 reader fills in for a v1 record: a kernel, outside any graph
V2_DEFAULTS = {"activity": "KERNEL", "bytes": 0, "copy_kind": "", "memory_kinds": "", "graph_id": 0,
               "graph_node_id": 0}


def test_every_topic_names_a_known_schema():
    reg = single_object.default_registry()
    for t in topics.ALL:
        assert reg.latest(t.schema).name == f"fleetprof.{t.schema}"


def test_single_object_header_is_marker_and_little_endian_crc64():
    data = single_object.encode("GpuKernel", KERNEL)
    schema = json.loads((single_object.SCHEMA_DIR / "gpu_kernel.v2.avsc").read_text())
    fp = int(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"), 16)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == struct.pack("<Q", fp)
    assert single_object.decode(data) == ("fleetprof.GpuKernel", {**KERNEL, **V2_DEFAULTS})


def test_known_crc64_avro_vector():
    # The Avro specification's fingerprint of the primitive schema "int" (Parsing Canonical Form `"int"`).
    assert fingerprint('"int"', "CRC-64-AVRO") == "8f5c393f1ad57572"


def test_registry_finds_every_latest_schema_by_its_fingerprint():
    reg = single_object.default_registry()
    for name in reg.names():
        sv = reg.latest(name)
        assert reg.by_fingerprint(sv.fingerprint) is sv


def _next_registry() -> single_object.SchemaRegistry:
    reg = single_object.SchemaRegistry().load_dir()
    for path in sorted(NEXT_DIR.glob("*.avsc")):
        reg.register_file(path)
    return reg


def test_written_with_v1_read_with_a_later_version_fills_new_fields_with_defaults():
    v1_bytes = single_object.encode("GpuKernel", KERNEL, version=1)  # what an agent of before copies and graphs sends
    assert single_object.decode(v1_bytes) == ("fleetprof.GpuKernel", {**KERNEL, **V2_DEFAULTS})
    name, rec = single_object.decode(v1_bytes, registry=_next_registry())
    assert name == "fleetprof.GpuKernel"
    assert rec == {**KERNEL, **V2_DEFAULTS, "grid": []}


def test_written_with_the_next_version_read_by_its_reader_and_unknown_to_a_current_reader():
    reg = _next_registry()
    data = single_object.encode("GpuKernel", {**KERNEL, "grid": [64, 1, 1], "graph_id": 9}, registry=reg)
    assert single_object.decode(data, registry=reg)[1]["grid"] == [64, 1, 1]
    with pytest.raises(single_object.DecodeError, match="unknown schema fingerprint"):
        single_object.decode(data)


def test_dropped_field_is_ignored_and_added_field_defaulted():
    batch = {"node": "n", "window_start_ns": 1, "window_ns": 2, "frequency_hz": 19, "kernel_build_id": "k",
             "simulated": True, "processes": [{"pid": 1, "comm": "c", "exe": "", "cgroup": "", "container_id": "",
                                               "mappings": [], "stacks": [{"tid": 1, "user_addrs": [-1, 5],
                                                                           "kernel_addrs": [], "count": 3}]}]}
    _, rec = single_object.decode(single_object.encode("CpuStackBatch", batch), registry=_next_registry())
    assert "simulated" not in rec
    assert rec["agent_version"] == "unknown"
    assert rec["processes"][0]["stacks"][0]["user_addrs"] == [-1, 5]


@pytest.mark.parametrize("bad, reason", [
    (b"", "missing C3 01 marker"),
    (b"\xc3\x01\x00", "missing C3 01 marker"),
    (b"{\"json\": true}", "missing C3 01 marker"),
    (single_object.MARKER + b"\xff" * 8 + b"\x00", "unknown schema fingerprint ffffffffffffffff"),
])
def test_bad_framing_gives_one_line_reason(bad, reason):
    with pytest.raises(single_object.DecodeError) as err:
        single_object.decode(bad)
    assert reason in str(err.value)
    assert "\n" not in str(err.value)


def test_truncated_and_trailing_bytes_are_errors():
    data = single_object.encode("GpuKernel", KERNEL)
    for cut in range(single_object.HEADER_LEN, len(data)):
        with pytest.raises(single_object.DecodeError, match="truncated or corrupt|trailing"):
            single_object.decode(data[:cut])
    with pytest.raises(single_object.DecodeError, match="1 trailing bytes"):
        single_object.decode(data + b"\x00")


def test_expected_record_name_is_enforced():
    with pytest.raises(single_object.DecodeError, match="expected fleetprof.CpuStackBatch"):
        single_object.decode(single_object.encode("GpuKernel", KERNEL), expect="CpuStackBatch")


def test_unsigned_addresses_keep_their_bits():
    for value in (0, 1, 0x7FFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF_8100_0000, 0xFFFF_FFFF_FFFF_FFFF):
        assert wire.long_to_u64(wire.u64_to_long(value)) == value
        assert -(1 << 63) <= wire.u64_to_long(value) < (1 << 63)


def test_an_older_version_can_still_be_written_on_purpose():
    reg = _next_registry()
    v1 = single_object.encode("GpuKernel", KERNEL, registry=reg, version=1)
    assert v1 == single_object.encode("GpuKernel", KERNEL, version=1) != single_object.encode("GpuKernel", KERNEL)
    with pytest.raises(KeyError, match="no version 7"):
        single_object.encode("GpuKernel", KERNEL, registry=reg, version=7)
