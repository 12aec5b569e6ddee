"""The fast CpuSamples writer writes exactly fastavro's bytes, and gives way to fastavro for anything else."""

from __future__ import annotations

import io
import random

import fastavro

from schemas import single_object
from schemas.cpu_samples_writer import encode_cpu_samples

SCHEMA = single_object.default_registry().latest("CpuSamples")
KINDS = ["NATIVE", "KERNEL", "INTERPRETED", "UNKNOWN"]
ORDER = ["node", "window_start_ns", "window_ns", "simulated", "frequency_hz", "frames", "stacks", "samples"]


def fastavro_body(rec: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA.parsed, rec)
    return buf.getvalue()


def random_record(r: random.Random) -> dict:
    def long() -> int:
        return r.choice([0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -2**31, 2**63 - 1, -2**63,
                         r.randrange(-2**63, 2**63), r.randrange(0, 1000)])

    def text() -> str:
        return r.choice(["", "a", "ü名", "x" * 200, "pt_main_thread"])

    rec = {"node": text(), "window_start_ns": long(), "window_ns": long(),
           "frames": [{"frame_id": long(), "function": text(), "binary": text(), "kind": r.choice(KINDS),
                       "build_id": text()} for _ in range(r.randrange(0, 4))],
           "stacks": [{"stack_id": long(), "frame_ids": [long() for _ in range(r.randrange(0, 5))]}
                      for _ in range(r.randrange(0, 4))],
           "samples": [{"pid": r.choice([0, 1, -5, 2**31 - 1, -2**31, 4_000_000]), "comm": text(),
                        "container_id": text(), "identity_id": long(), "stack_id": long(), "count": long()}
                       for _ in range(r.randrange(0, 5))],
           "simulated": r.choice([True, False]), "frequency_hz": r.choice([0, 19, 99, -1, 2**31 - 1])}
    return {k: rec[k] for k in ORDER} if r.random() < 0.5 else rec  # the symbolize stage's key order, or the schema's


def test_same_bytes_as_fastavro() -> None:
    r = random.Random(1)
    for _ in range(2000):
        rec = random_record(r)
        assert encode_cpu_samples(rec) == fastavro_body(rec)
        assert single_object.encode("CpuSamples", rec) == single_object.MARKER + SCHEMA.fingerprint + fastavro_body(rec)
        assert single_object.decode(single_object.encode("CpuSamples", rec))[1] == rec


def test_anything_unexpected_is_left_to_fastavro() -> None:
    rec = random_record(random.Random(2))
    assert encode_cpu_samples({"node": "x"}) is None
    assert encode_cpu_samples({**rec, "frequency_hz": 2**40}) is None
    assert encode_cpu_samples({**rec, "samples": [{"pid": 2**31, "comm": "", "container_id": "", "identity_id": 0,
                                                    "stack_id": 1, "count": 1}]}) is None
    assert encode_cpu_samples({**rec, "frames": [{"frame_id": 1, "function": "f", "binary": "b", "kind": "JIT",
                                                   "build_id": ""}]}) is None
    assert encode_cpu_samples({**rec, "node": b"bytes"}) is None
    assert encode_cpu_samples({**rec, "extra": 1}) is None
