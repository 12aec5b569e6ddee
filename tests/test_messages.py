"""Decoding at the runner's edge: every failure becomes a dead letter carrying the whole message and one reason."""

from __future__ import annotations

from processors.messages import Message, Produced, decode_message
from schemas import single_object
from schemas.packed_stacks import PackedStacks


class Raw:
    """The part of confluent_kafka.Message the runners read."""

    def __init__(self, value, key=b"k", topic="gpu.kernels", partition=2, offset=40):
        self._v, self._k, self._t, self._p, self._o = value, key, topic, partition, offset

    def value(self):
        return self._v

    def key(self):
        return self._k

    def topic(self):
        return self._t

    def partition(self):
        return self._p

    def offset(self):
        return self._o


KERNEL = {"node": "n1", "pid": 42, "process_start_ns": 3, "correlation_id": 7, "start_ns": 100, "end_ns": 250,
          "device_id": 0, "stream_id": 13, "kernel_name": "k", "activity": "KERNEL", "bytes": 0, "copy_kind": "",
          "memory_kinds": "", "graph_id": 0, "graph_node_id": 0, "simulated": False}
EXPECT = {"gpu.kernels": "GpuKernel"}


def test_good_message_decodes_with_position():
    m = decode_message("s", Raw(single_object.encode("GpuKernel", KERNEL)), EXPECT, 1 << 20)
    assert isinstance(m, Message)
    assert (m.topic, m.partition, m.offset, m.record) == ("gpu.kernels", 2, 40, KERNEL)


def _reason(value, limit=1 << 20, topic="gpu.kernels") -> Produced:
    d = decode_message("stage-x", Raw(value, topic=topic), EXPECT, limit)
    assert isinstance(d, Produced) and d.topic == "deadletter"
    assert d.record["value"] == value and d.record["key"] == b"k"
    assert (d.record["source_topic"], d.record["source_partition"], d.record["source_offset"]) == (topic, 2, 40)
    assert d.record["stage"] == "stage-x"
    single_object.encode(d.schema, d.record)  # the dead letter itself is a valid message
    return d.record["reason"]


def test_oversize_empty_wrong_schema_and_garbage_are_dead_letters():
    data = single_object.encode("GpuKernel", KERNEL)
    assert _reason(data, limit=10) == f"oversize message: {len(data)} bytes > limit 10"
    assert _reason(None) == "empty message (no value)"
    wrong = single_object.encode("GpuKernel", KERNEL)
    assert "expected fleetprof.CpuStackBatch" in decode_message(
        "s", Raw(wrong, topic="cpu.stacks"), {"cpu.stacks": "CpuStackBatch"}, 1 << 20).record["reason"]
    assert "missing C3 01 marker" in _reason(b"garbage")
    assert "truncated" in _reason(data[:-4])


def test_columnar_cpu_batches_keep_the_raw_bytes():
    batch = {"node": "n", "window_start_ns": 1, "window_ns": 2, "frequency_hz": 19, "kernel_build_id": "",
             "simulated": True, "processes": [{"pid": 1, "comm": "c", "exe": "", "cgroup": "", "container_id": "",
                                               "identity_id": 0, "mappings": [], "code_objects": [],
                                               "stacks": [{"tid": 1, "user_addrs": [-1, 5],
                                                           "kernel_addrs": [], "count": 3}]}]}
    value = single_object.encode("CpuStackBatch", batch)
    raw = Raw(value, topic="cpu.stacks")
    m = decode_message("s", raw, {"cpu.stacks": "CpuStackBatch"}, 1 << 20, columnar=True)
    assert isinstance(m, Message) and m.value == value
    stacks = m.record["processes"][0]["stacks"]
    assert isinstance(stacks, PackedStacks) and stacks.records() == batch["processes"][0]["stacks"]
    plain = decode_message("s", raw, {"cpu.stacks": "CpuStackBatch"}, 1 << 20)
    assert plain.record == batch
