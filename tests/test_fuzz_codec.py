"""Hostile bytes at the decoders: every schema's single_object.decode, the columnar CPU-batch decoder and
decode_message give a record or a one-line DecodeError / dead letter, never another exception. Property tests run a
bounded, derandomized number of examples here; tests/fuzz/run_atheris.py runs the same targets (tests/fuzz/targets.py)
for longer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.messages import MAX_KEPT_BYTES, Message, Produced, dead_letter
from schemas import single_object, topics
from schemas.cpu_batch_writer import long_bytes
from tests.fuzz import targets
from tests.fuzz.records import EDITS, mutate, record_of

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SCHEMAS = [name.split(".", 1)[1] for name in single_object.default_registry().names()]
SEEDS = sorted(p for p in targets.CORPUS.glob("*/*") if p.is_file())


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_seed_of_the_corpus_meets_its_target(path: Path):
    targets.TARGETS[path.parent.name](path.read_bytes())


def test_the_corpus_has_seeds_for_every_target():
    assert {p.parent.name for p in SEEDS} == set(targets.TARGETS)


@pytest.mark.parametrize("schema", SCHEMAS)
def test_hostile_records_round_trip_and_their_mutations_decode_or_fail_cleanly(schema):
    @FUZZ
    @given(record_of(schema), EDITS)
    def check(record, edits):
        data = single_object.encode(schema, record)
        assert targets.check_decode(data) is not None  # a valid message decodes (and re-encodes) whatever it holds
        mutated = mutate(data, edits)
        targets.check_decode(mutated)
        topic = next((t.name for t in topics.ALL if t.schema == schema), "cpu.stacks")
        targets.check_decode_message(mutated, topic)
        if schema == "CpuStackBatch":
            targets.check_columnar(mutated)

    check()


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("body", [b"", long_bytes(2**62), long_bytes(-(2**62)), long_bytes(-1) + b"ab",
                                  b"\xff" * 11, long_bytes(2**31) * 40, long_bytes(-5) * 50, long_bytes(1) * 5000,
                                  long_bytes(2**20) + b"x" * 100],
                         ids=["empty", "huge-length", "huge-negative", "negative", "long-varint", "int-overflow",
                              "negative-lengths", "many-small", "short-string"])
def test_bogus_lengths_and_counts_are_decode_errors(schema, body):
    data = targets.with_header(schema, body)
    with targets.time_limit(10):
        targets.check_decode(data)
        item = targets.check_decode_message(data, next((t.name for t in topics.ALL if t.schema == schema),
                                                       "cpu.stacks"))
    assert isinstance(item, Produced) or isinstance(item, Message)


@FUZZ
@given(st.binary(max_size=2048), st.sampled_from([t.name for t in topics.ALL]))
def test_random_bytes_on_any_topic_are_dead_letters_with_a_reason(data, topic):
    item = targets.check_decode_message(data, topic)
    assert isinstance(item, Produced)  # nothing random is a message of ours (marker and fingerprint)


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bodies_behind_every_fingerprint(data):
    targets.check_avro_body(data)


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bodies_to_the_columnar_decoder(data):
    targets.check_columnar(targets.with_header("CpuStackBatch", data))


def test_an_unknown_fingerprint_names_itself():
    data = single_object.encode("GpuKernel", {"node": "n", "pid": 1, "process_start_ns": 0, "correlation_id": 1,
                                      "start_ns": 0, "end_ns": 1, "device_id": 0, "stream_id": 0, "kernel_name": "k",
                                      "simulated": False})
    wrong = data[:2] + bytes.fromhex("0123456789abcdef") + data[10:]
    item = targets.check_decode_message(wrong, "gpu.kernels")
    assert item.record["reason"] == "unknown schema fingerprint efcdab8967452301"


def test_a_dead_letter_fits_a_kafka_message_whatever_it_wraps():
    """A dead letter keeps the message whole, unless that would make the dead letter itself too large to send."""
    small = dead_letter("s", "cpu.stacks", 0, 5, b"k", b"x" * 1000, "bad\nsecond line")
    assert small.record["value"] == b"x" * 1000 and small.record["reason"] == "bad"
    big = dead_letter("s", "cpu.stacks", 0, 5, b"k", b"x" * (MAX_KEPT_BYTES + 1), "x" * 10_000)
    assert big.record["value"] is None and len(single_object.encode(big.schema, big.record)) < 1_000_000
    assert big.record["reason"].endswith(f"[the message's {MAX_KEPT_BYTES + 1} bytes are not kept: over the "
                                         f"{MAX_KEPT_BYTES}-byte dead letter limit]")
    assert dead_letter("s", "t", 0, 0, None, None, "").record["reason"] == "unknown"


def test_an_int_field_beyond_32_bits_is_a_decode_error():
    """fastavro reads an int as a long, unchecked: a GPU index of -2^62 decoded, went into the alerter's state and
    broke the runner when it wrote that state (found by atheris on stage_alerts, seed int-overflow-index.bin)."""
    from tests.fuzz.make_corpus import RECORDS

    poll = {**RECORDS["GpuMetrics"], "processes": []}
    head = single_object.encode("GpuMetrics", {**poll, "devices": [{**poll["devices"][0], "index": 0}]})
    index_at = len(single_object.encode("GpuMetrics", {**poll, "devices": []})) - 1  # the device count, then its index
    assert head[index_at - 1:index_at + 1] == long_bytes(1) + long_bytes(0)
    for value in (2**31, -(2**31) - 1, -(2**62)):
        bad = head[:index_at] + long_bytes(value) + head[index_at + 1:]
        with pytest.raises(single_object.DecodeError,
                           match="an int field of fleetprof.GpuMetrics holds a value outside 32"):
            single_object.decode(bad)
        assert isinstance(targets.check_decode_message(bad, "gpu.metrics"), Produced)
    edge = head[:index_at] + long_bytes(2**31 - 1) + head[index_at + 1:]
    assert single_object.decode(edge)[1]["devices"][0]["index"] == 2**31 - 1


def test_an_int_beyond_32_bits_deep_in_a_long_array_of_records_is_a_decode_error():
    """The check reads an array of records a column at a time (min and max of each int field): one pid out of range
    among a thousand samples, at either end of the range, is found; longs beside it are not ints and pass."""
    import io
    import json

    import fastavro

    reg = single_object.default_registry()
    latest = reg.latest("fleetprof.CpuSamples")
    # ints and longs share Avro's zig-zag varint: a schema with pid as a long writes what a broken int writer would
    wide = json.loads(json.dumps(latest.parsed).replace('"name": "pid", "type": "int"',
                                                        '"name": "pid", "type": "long"'))
    assert wide != latest.parsed
    samples = [{"pid": 7 + i, "comm": "c", "container_id": "", "identity_id": 2**62, "stack_id": -(2**63),
                "count": 2**40} for i in range(1000)]
    record = {"node": "n", "window_start_ns": 0, "window_ns": 10, "frames": [], "stacks": [], "samples": samples,
              "simulated": False, "frequency_hz": 19}

    def message(pid_at_700: int) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(wide), {
            **record, "samples": [*samples[:700], {**samples[700], "pid": pid_at_700}, *samples[701:]]})
        return single_object.encode("CpuSamples", record)[:single_object.HEADER_LEN] + body.getvalue()

    for ok in (2**31 - 1, -(2**31)):
        assert single_object.decode(message(ok))[1]["samples"][700]["pid"] == ok
    for bad in (2**31, -(2**31) - 1, 2**62):
        with pytest.raises(single_object.DecodeError, match="an int field of fleetprof.CpuSamples holds a value"):
            single_object.decode(message(bad))


def test_a_nullable_int_beyond_32_bits_among_nulls_is_a_decode_error():
    """["null", "int"] fields (most of a GPU's NVML readings) are checked a column at a time too, nulls left out: one
    device's power out of range among eight, the others null or in range, is found; all nulls pass."""
    import io
    import json

    import fastavro

    latest = single_object.default_registry().latest("fleetprof.GpuMetrics")
    text = json.dumps(latest.parsed)
    wide = json.loads(text.replace('"name": "power_mw", "type": ["null", "int"]',
                                   '"name": "power_mw", "type": ["null", "long"]'))
    assert wide != latest.parsed
    from tests.fuzz.make_corpus import RECORDS

    device = RECORDS["GpuMetrics"]["devices"][0]
    poll = {**RECORDS["GpuMetrics"], "processes": []}

    def message(powers: list[int | None]) -> bytes:
        record = {**poll, "devices": [{**device, "index": i, "power_mw": p} for i, p in enumerate(powers)]}
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(wide), record)
        return single_object.encode("GpuMetrics", poll)[:single_object.HEADER_LEN] + body.getvalue()

    ok = [None, 2**31 - 1, None, -(2**31), 5, None, 0, None]
    assert [d["power_mw"] for d in single_object.decode(message(ok))[1]["devices"]] == ok
    assert [d["power_mw"] for d in single_object.decode(message([None] * 8))[1]["devices"]] == [None] * 8
    for bad in (2**31, -(2**31) - 1, 2**62):
        with pytest.raises(single_object.DecodeError, match="an int field of fleetprof.GpuMetrics holds a value"):
            single_object.decode(message([None, 3, None, bad, None, 4, None, None]))
