"""The agent's outbox on its own: the bound, what it drops first, tables that must precede the records needing
them, and messages Kafka refuses for good (counted, never fatal). Through the real producer and the session's broker
where anything is sent; a KafkaLink that never started stands for Kafka being away (nothing is handed over)."""

from __future__ import annotations

import time
import uuid

from producers.kafka_link import READY, UNREACHABLE, KafkaLink
from producers.outbox import Outbox
from producers.outbox_encoder import UNIT_BYTES, OutboxEncoder, record_units
from producers.outbox_units import Unit
from producers.publisher import Publisher
from schemas.topics import Topic
from tests.pipeline_helpers import read_topic

AWAY = {"bootstrap.servers": "127.0.0.1:1"}


def _unit(kind: str, size: int, records: int = 1, tables: set[str] = frozenset(), needs: set[str] = frozenset(),
          topic: str = "t", tag: int = 0) -> Unit:
    return Unit(kind, [(topic, "k", bytes([tag]) * size, records)], frozenset(tables), frozenset(needs))


def _away_outbox(max_bytes: int, encoder: OutboxEncoder | None = None) -> Outbox:
    return Outbox(Publisher(AWAY), KafkaLink(AWAY, ["t"]), encoder or OutboxEncoder(), max_bytes)


def test_the_oldest_record_units_go_first_and_are_counted_per_kind() -> None:
    box = _away_outbox(1000)
    box.add([_unit("symbols", 100, tables={"b1"}), _unit("cpu", 300, records=7, needs={"b1"})])
    box.add([_unit("gpu_launches", 300, records=3, needs={"b1"}), _unit("gpu_metrics", 200)])
    assert box.pending_bytes == 900 and not any(t.units for t in box.dropped.values())
    box.add([_unit("gpu_kernels", 250, records=5)])  # 1,150 bytes: the oldest records (the CPU window) go
    assert (box.dropped["cpu"].units, box.dropped["cpu"].records, box.dropped["cpu"].bytes) == (1, 7, 300)
    assert [u.kind for u in box.held] == ["symbols", "gpu_launches", "gpu_metrics", "gpu_kernels"]
    box.add([_unit("cpu", 700, records=9)])  # the launches, the poll and the kernels make room; the newest stays
    assert [u.kind for u in box.held] == ["symbols", "cpu"] and box.pending_bytes == 800
    assert {k: t.records for k, t in box.dropped.items()} == {"symbols": 0, "cpu": 7, "gpu_launches": 3,
                                                            "gpu_kernels": 5, "gpu_metrics": 1,
                                                            "dead_letters": 0}


def test_tables_are_dropped_last_and_with_every_unit_that_needs_them() -> None:
    encoder = OutboxEncoder()
    encoder.sent_build_ids |= {"b1", "b2"}
    box = _away_outbox(1000, encoder)
    box.add([_unit("symbols", 500, tables={"b1"}), _unit("cpu", 100, needs={"b1"})])
    box.add([_unit("symbols", 300, tables={"b2"}), _unit("gpu_launches", 50, needs={"b2"})])
    box.add([_unit("gpu_kernels", 400)])  # over: the records go first, then b1's table and what needs it
    assert [(u.kind, u.tables) for u in box.held] == [("symbols", {"b2"}), ("gpu_kernels", frozenset())]
    assert box.dropped["symbols"].units == 1 and box.dropped["cpu"].units == box.dropped["gpu_launches"].units == 1
    assert encoder.sent_build_ids == {"b2"}  # b1's table goes again with the next batch that needs it


def test_a_drain_larger_than_the_bound_while_kafka_is_away_leaves_the_bound_but_for_one_unit() -> None:
    # an agent held up for seconds drains thousands of launches at once (12 s stopped: 4,825 launches, 3.7 MB):
    # cut into units, all but the newest go oldest first, and what is held stays within the bound plus that unit
    encoder = OutboxEncoder()
    box = _away_outbox(100_000, encoder)
    box.add([_unit("cpu", 60_000, records=9)])
    launches = [{"node": "n", "pid": 7, "tid": 7, "process_start_ns": 1, "time_ns": 10**18 + i, "correlation_id": i,
                 "callback_id": 211, "api_name": "cudaLaunchKernel", "weight": 1, "nvtx_range": "", "graph": False,
                 "identity_id": 0, "user_addrs": list(range(1000, 1040)), "mappings": [], "code_objects": [],
                 "simulated": True} for i in range(3000)]
    units = encoder.units("gpu_launches", launches)
    assert len(units) > 3 and sum(u.records for u in units) == 3000
    assert all(u.size <= UNIT_BYTES for u in units) and max(u.size for u in units) > UNIT_BYTES // 2
    box.add(units)
    newest = units[-1]
    assert box.held[-1] is newest and box.pending_bytes <= 100_000 + newest.size
    assert box.peak_bytes <= 100_000 + newest.size
    assert box.dropped["cpu"].records == 9  # the oldest went first
    held = sum(u.records for u in box.held)
    assert held + box.dropped["gpu_launches"].records == 3000 and held >= newest.records
    # while Kafka takes messages, what is put now stays whole: a window larger than the bound still goes
    box.link.state = READY
    assert box._kept(units) == {id(u) for u in units}


def test_kafka_that_looks_up_but_acknowledges_nothing_is_said_once_per_interval(caplog) -> None:
    # the link's checks pass (READY) while nothing handed to librdkafka is acknowledged (here: nothing listens where
    # the producer sends): the agent says so, at most once per silent_warn_s, and not while Kafka is away
    link = KafkaLink(AWAY, ["t"], stall_s=0.05)
    link.state = READY
    box = Outbox(Publisher(dict(AWAY, **{"statistics.interval.ms": 100})), link, OutboxEncoder(), 100_000,
                 silent_warn_s=0.3)
    caplog.set_level("WARNING", logger="fleetprof.agent")
    box.add([_unit("cpu", 1_000, records=4), _unit("gpu_launches", 2_000, records=9)])
    assert box.unconfirmed == 2 and box.held_bytes == 0
    box.pump()
    assert not [r for r in caplog.records if "acknowledged nothing" in r.message]  # not yet silent_warn_s
    time.sleep(0.35)
    box.pump()
    box.pump()
    said = [r.message for r in caplog.records if "acknowledged nothing" in r.message]
    assert len(said) == 1 and "127.0.0.1:1 is reachable" in said[0] and "2 messages (0.00 MiB)" in said[0], said
    # with what the producer's statistics last said of its brokers (the state of each, the requests waiting on it)
    assert "; brokers: 127.0.0.1:1 " in said[0] and "awaiting a response 0" in said[0], said
    link.state = UNREACHABLE
    time.sleep(0.35)
    box.pump()
    assert len([r for r in caplog.records if "acknowledged nothing" in r.message]) == 1


def test_a_drain_splits_at_the_unit_size_and_keeps_every_message_in_order() -> None:
    messages = [("t", "k", bytes([i % 256]) * (100 + i), 1) for i in range(500)]
    units = record_units("gpu_kernels", messages, frozenset({"b1"}), unit_bytes=5_000)
    assert [m for u in units for m in u.messages] == messages
    assert all(u.size <= 5_000 and u.needs == {"b1"} for u in units)
    # each unit as full as fits: the next one's first message would not have
    assert all(a.size + len(b.messages[0][2]) > 5_000 for a, b in zip(units[:-1], units[1:], strict=True))
    big = [("t", "k", b"x" * 9_000, 1), ("t", "k", b"y" * 10, 1)]
    assert [len(u.messages) for u in record_units("dead_letters", big, unit_bytes=5_000)] == [1, 1]
    assert record_units("gpu_metrics", []) == []


def test_a_message_kafka_refuses_is_counted_and_the_rest_delivered(kafka_bootstrap: str) -> None:
    run = uuid.uuid4().hex[:8]
    topic = Topic(f"refused-{run}", "CpuStackBatch", 1, -1)
    from fleetprof.broker import create_topics

    create_topics(kafka_bootstrap, [topic])
    config = {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 20_000}
    link = KafkaLink(config, [topic.name])
    link.state = READY
    box = Outbox(Publisher(config), link, OutboxEncoder(), 1 << 20)
    box.add([_unit("cpu", 100, records=2, topic=topic.name, tag=1), _unit("cpu", 50_000, topic=topic.name, tag=2),
             _unit("gpu_kernels", 100, topic=topic.name, tag=3)])
    assert box.drain(30)
    assert box.unsendable["cpu"] == 1 and box.sent["cpu"].records == 3 and box.sent["gpu_kernels"].records == 1
    got = read_topic(kafka_bootstrap, topic.name, lambda m: True, want=2, timeout=30)
    assert sorted(m.value()[0] for m in got) == [1, 3]


def test_what_librdkafka_holds_stays_under_the_in_flight_limit_for_large_tables_too(kafka_bootstrap: str) -> None:
    """A broker that is up but slow must not let librdkafka hold more than the bound allows (all of it counts once
    Kafka goes away): symbol tables many messages long go a few messages at a time, records only after them."""
    run = uuid.uuid4().hex[:8]
    topic = Topic(f"inflight-{run}", "CpuStackBatch", 1, -1)
    from fleetprof.broker import create_topics

    create_topics(kafka_bootstrap, [topic])
    config = {"bootstrap.servers": kafka_bootstrap}
    link = KafkaLink(config, [topic.name])
    link.state = READY
    box = Outbox(Publisher(config), link, OutboxEncoder(), 400_000)  # in flight: at most 200,000 bytes
    tables = Unit("symbols", [(topic.name, f"b1/{i}", bytes([i]) * 90_000, 1) for i in range(12)], frozenset({"b1"}))
    records = Unit("cpu", [(topic.name, "r", bytes([100 + i]) * 90_000, 5) for i in range(3)], needs=frozenset({"b1"}))
    box.add([tables, records])
    most = box._inflight
    assert 0 < most <= 200_000 and box.held[0] is tables and box._head_sent == 2  # the unit is handed over in parts
    while not box.empty:
        most = max(most, box._inflight)
        box.pump() or box.publisher.poll(0.02)
    assert most <= 200_000 and box.sent["symbols"].records == 12 and box.sent["cpu"].records == 15
    assert box.pending_bytes == 0
    got = read_topic(kafka_bootstrap, topic.name, lambda m: True, want=15, timeout=30)
    assert [m.value()[0] for m in got] == [*range(12), 100, 101, 102]  # in order, each once


CID = "ab" * 32


def _batch(*procs: tuple[int, int]) -> dict:
    """A CpuStackBatch of (pid, identity_id) processes, one stack each."""
    return {"node": "n1", "window_start_ns": 0, "window_ns": 1, "frequency_hz": 19, "kernel_build_id": "",
            "simulated": False, "processes": [
                {"pid": pid, "comm": "c", "exe": "", "cgroup": "", "container_id": "", "identity_id": ident,
                 "mappings": [], "code_objects": [],
                 "stacks": [{"tid": pid, "user_addrs": [1], "kernel_addrs": [], "count": 1}]}
                for pid, ident in procs]}


def test_identity_definitions_go_once_before_the_records_and_again_when_their_unit_was_dropped() -> None:
    from producers.identity_refs import gpu_identity, process_identity
    from producers.outbox_encoder import identity_table
    from producers.process_info import ProcessInfo
    from schemas import single_object
    from schemas.wire import identity_key
    from tests.identity_doubles import CgroupIdentities

    ids = CgroupIdentities("n1", gpu_pods={"GPU-1": CID})
    pod = process_identity(ids, ProcessInfo(7, "train", "", f"/kubepods/pod1/{CID}", CID))
    host = process_identity(ids, ProcessInfo(8, "sshd", "", "/system.slice/ssh.service", ""))
    encoder = OutboxEncoder(identities=ids)
    first = encoder.units("cpu", [_batch((7, pod), (8, host), (9, 0))])
    assert [u.kind for u in first] == ["symbols", "cpu"]
    names = {identity_table(pod), identity_table(host)}
    assert first[0].tables == names and names <= first[1].needs
    assert sorted((t, k) for t, k, _, _ in first[0].messages) == sorted(
        [("identities", identity_key(pod)), ("identities", identity_key(host))])
    sent = {single_object.decode(v)[1]["pod_name"] for _, _, v, _ in first[0].messages}
    assert sent == {f"pod-{CID[:6]}", ""}
    again = encoder.units("cpu", [_batch((7, pod))])  # known now: the records only, still needing the table
    assert [u.kind for u in again] == ["cpu"] and again[0].needs == {identity_table(pod)}
    poll = {"node": "n1", "time_ns": 1, "simulated": False,
            "devices": [{"index": 0, "uuid": "GPU-1", "name": "g", "parent_uuid": "",
                         "identity_id": gpu_identity(ids, "GPU-1")}],
            "processes": [{"device_index": 0, "pid": 8, "identity_id": host}]}
    (metrics,) = encoder.units("gpu_metrics", [poll])  # the GPU's pod and the process's host: both sent already
    assert metrics.kind == "gpu_metrics" and metrics.needs == names
    assert [u.needs for u in encoder.units("gpu_kernels", [{"node": "n1", "pid": 7, "process_start_ns": 0,
                                                            "correlation_id": 1, "start_ns": 1, "end_ns": 2,
                                                            "device_id": 0, "stream_id": 0,
                                                            "kernel_name": "k"}])] == [frozenset()]
    # the outbox drops the table unit (Kafka away, over the bound) and what needs it: the definitions go again
    box = _away_outbox(first[0].size + first[1].size + 10, encoder)
    box.add(first)
    box.add([_unit("gpu_kernels", first[0].size + 20)])
    assert [u.kind for u in box.held] == ["gpu_kernels"] and box.dropped["symbols"].units == 1
    assert encoder.sent_identities == {}
    resent = encoder.units("cpu", [_batch((7, pod))])
    assert [u.kind for u in resent] == ["symbols", "cpu"] and resent[0].tables == {identity_table(pod)}
    # no resolver: every id stays 0 and nothing is sent
    plain = OutboxEncoder()
    assert [u.kind for u in plain.units("cpu", [_batch((7, pod))])] == ["cpu"]
    assert process_identity(None, ProcessInfo(7, "train", "", "", CID)) == 0
