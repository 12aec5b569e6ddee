"""The correlator's batch decoder (processors/correlate_decode.py) returns exactly what the runner's one-by-one
decode does, message by message: the same records for launches and kernels of every shape, and the same dead
letters (or records) for messages of older writers, other records, corrupt, truncated and oversize ones."""

from __future__ import annotations

import random
import re

import pytest

from processors.correlate_decode import MAX_TAIL_BYTES, MAX_TAILS, BatchDecoder
from processors.messages import Message, decode_message
from processors.runner import expected_schemas
from schemas import avro_fast, single_object, topics
from tests.test_avro_fast import compiled
from tests.test_correlate import GEMM, MAPPINGS, kernel, launch

INPUTS = (topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name)
EXPECT = expected_schemas(INPUTS)
MAX = 16 << 20
PATHS = ["compiled", "numpy"]  # the codec's batch reader (where it is built), or numpy heads and cached tails


def decoder_for(path: str) -> BatchDecoder:
    if path == "compiled":
        compiled(avro_fast.batch_reader_for("long"))  # a failure in CI, a skip elsewhere, where it cannot be built
    decoder = BatchDecoder(compiled=path == "compiled")
    assert all((lay.read_each is not None) == (path == "compiled") for lay in decoder.layouts.values())
    return decoder


class Raw:
    """A consumed message as confluent_kafka hands it over."""

    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None, key: bytes = b"k") -> None:
        self._t = (topic, partition, offset, key, value)

    def topic(self) -> str:
        return self._t[0]

    def partition(self) -> int:
        return self._t[1]

    def offset(self) -> int:
        return self._t[2]

    def key(self) -> bytes:
        return self._t[3]

    def value(self) -> bytes | None:
        return self._t[4]


def same(a: object, b: object) -> bool:
    """Equal, but for a dead letter's time of writing (and an address in its reason)."""
    if isinstance(a, Message) or isinstance(b, Message):
        return a == b
    # fastavro's messages name the buffer object it read from by its address
    ra, rb = ({**r.record, "time_ns": 0, "reason": re.sub(r" at 0x[0-9a-f]+", "", r.record["reason"])} for r in (a, b))
    return (a.topic, a.key, a.schema, ra) == (b.topic, b.key, b.schema, rb)


def check(raws: list[Raw], decoder: BatchDecoder) -> list:
    fast = decoder.decode("correlate", raws, EXPECT, MAX)
    slow = [decode_message("correlate", r, EXPECT, MAX) for r in raws]
    assert len(fast) == len(slow)
    for i, (f, s) in enumerate(zip(fast, slow, strict=True)):
        assert same(f, s), (i, f, s)
    return fast


def records(rng: random.Random, n: int) -> list[Raw]:
    out = []
    for i in range(n):
        t = rng.randrange(-(1 << 63), 1 << 63) if rng.random() < 0.1 else 1_767_000_000_000_000_000 + i * 997
        if rng.random() < 0.5:
            rec = launch(rng.randrange(1 << 40), t, ["main", "run", "compute"][: rng.randrange(1, 4)],
                         weight=rng.randrange(1, 5000), pid=rng.randrange(1, 1 << 31), maps=rng.random() < 0.2,
                         node=rng.choice(["n1", "nœud-2", "x" * 200]))
            rec.update(nvtx_range=rng.choice(["", "step > fwd"]), graph=rng.random() < 0.1,
                       identity_id=rng.randrange(-(1 << 63), 1 << 63),
                       code_objects=rng.choice([[], [{"qualname": "f", "file": "a.py", "first_line": 3}]]))
            out.append(Raw(topics.GPU_LAUNCHES.name, i % 3, i, single_object.encode("GpuLaunch", rec)))
        else:
            rec = kernel(rng.randrange(1 << 40), t, rng.randrange(0, 1 << 40), name=rng.choice([GEMM, "k", ""]),
                         device=rng.randrange(0, 1 << 16), stream=rng.randrange(-(1 << 31), 1 << 31))
            if rng.random() < 0.3:
                rec.update(activity=rng.choice(["MEMCPY", "MEMSET"]), bytes=rng.randrange(0, 1 << 50),
                           copy_kind="HtoD", memory_kinds="PAGEABLE>DEVICE", graph_id=rng.randrange(0, 9),
                           graph_node_id=rng.randrange(-5, 1 << 62))
            out.append(Raw(topics.GPU_KERNELS.name, i % 3, i, single_object.encode("GpuKernel", rec)))
    return out


@pytest.mark.parametrize("path", PATHS)
def test_launches_and_kernels_of_every_shape_decode_as_one_by_one(path: str) -> None:
    raws = records(random.Random(18), 600)
    decoder = decoder_for(path)
    got = check(raws, decoder)
    assert all(isinstance(m, Message) for m in got)
    assert check(raws, decoder)  # again, with the launch tails cached
    launches = [m.record for m in got if m.topic == topics.GPU_LAUNCHES.name]
    assert any(r["mappings"] == MAPPINGS for r in launches) and any(r["mappings"] == [] for r in launches)


def test_the_numpy_path_keeps_short_launch_tails_only_and_within_their_count() -> None:
    # a launch that carries its process's mappings is kilobytes and seldom repeats: read each time, never kept, as on
    # the compiled path (MAX_TAIL_BYTES); the others are kept, and the cache is cleared when it holds MAX_TAILS
    decoder = decoder_for("numpy")
    lay = decoder.layouts["GpuLaunch"]
    libs = [{**MAPPINGS[0], "start": MAPPINGS[0]["start"] + (i << 24), "limit": MAPPINGS[0]["limit"] + (i << 24),
             "path": f"/usr/lib/x86_64-linux-gnu/libexample-{i}.so.1"} for i in range(30)]

    def raw(offset: int, path: list[str], maps: list[dict]) -> Raw:
        rec = {**launch(offset, 1_767_000_000 + offset, path), "mappings": maps}
        return Raw(topics.GPU_LAUNCHES.name, 0, offset, single_object.encode("GpuLaunch", rec))

    bare = [raw(i, ["main"], []) for i in range(3)]
    mapped = [raw(3 + i, ["main"], libs) for i in range(3)]
    assert len(mapped[0].value()) > MAX_TAIL_BYTES + 200 > len(bare[0].value()) + 200
    check(bare + mapped, decoder)
    assert len(lay.tails) == 1 and all(len(tail) <= MAX_TAIL_BYTES for tail in lay.tails)
    lay.tails.update({i.to_bytes(2, "little"): {} for i in range(MAX_TAILS - 1)})
    check(bare, decoder)  # the kept tail is found: nothing added
    assert len(lay.tails) == MAX_TAILS
    check([raw(9, ["run", "compute"], [])], decoder)  # a new tail into a full cache clears it first
    assert len(lay.tails) == 1


@pytest.mark.parametrize("path", PATHS)
def test_older_writers_other_records_and_broken_messages_get_what_they_always_got(path: str) -> None:
    rng = random.Random(7)
    good = records(rng, 200)
    old = single_object.encode("GpuKernel", kernel(5, 10, 20), version=1)
    raws = [Raw(topics.GPU_KERNELS.name, 0, 1, old),  # an older writer: the codec's own resolution
            Raw(topics.GPU_LAUNCHES.name, 0, 2, single_object.encode("GpuKernel", kernel(5, 10, 20))),  # wrong record
            Raw(topics.GPU_KERNELS.name, 0, 3, None), Raw(topics.GPU_KERNELS.name, 0, 4, b"\xc3\x01junk")]
    for i, r in enumerate(good):
        value = r.value()
        cut = rng.randrange(10, len(value))
        raws.append(Raw(r.topic(), 0, 10 + i, value[:cut]))  # truncated
        flipped = bytearray(value)
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(10, len(value))] = rng.randrange(256)
        raws.append(Raw(r.topic(), 1, 10 + i, bytes(flipped)))  # corrupt: a record, a different one, or a letter
        raws.append(Raw(r.topic(), 2, 10 + i, value + b"\x00"))  # trailing bytes
    raws.append(Raw(topics.GPU_KERNELS.name, 0, 5, good[1].value()))
    got = check(raws, decoder_for(path))
    assert sum(isinstance(m, Message) for m in got) > 1
    assert sum(not isinstance(m, Message) for m in got) > 300


@pytest.mark.parametrize("path", PATHS)
def test_an_int_field_outside_32_bits_is_refused_as_by_the_codec(path: str) -> None:
    rec = kernel(1, 2, 3)
    body = single_object.encode("GpuKernel", rec)
    # the pid's zigzag varint (2 * 4242 = 8484: 0xa4 0x42) rewritten as 2^32 (5 bytes): a reader could not write it
    i = body.index(bytes([0xA4, 0x42]), 10)
    wide = body[:i] + bytes([0x80, 0x80, 0x80, 0x80, 0x20]) + body[i + 2:]
    got = check([Raw(topics.GPU_KERNELS.name, 0, 0, wide)], decoder_for(path))
    assert not isinstance(got[0], Message)
