"""The symbolize stage sends each stack and frame definition once per commit, and again after an abort; CpuStackBatch
v1 to v3 side by side: an older agent feeds newer processors, a newer batch to older processors is dead-lettered;
each sample keeps its process's identity id (0 from an agent before identities)."""

from __future__ import annotations

from processors.messages import Message
from processors.symbol_tables import SymbolTables
from processors.symbolize_stage import SymbolizeStage
from tests.pipeline_helpers import build_id_for, cpu_batch, stack, symbol_chunks


def _stage() -> tuple[SymbolizeStage, str]:
    bid = build_id_for("stages")
    tables = SymbolTables()
    for c in symbol_chunks(bid):
        tables.add_chunk(c)
    return SymbolizeStage(tables), bid


def _msg(bid: str, offset: int, paths) -> Message:
    rec = cpu_batch("n1", bid, 10**18, [stack(p, 1, tid=i) for i, p in enumerate(paths)])
    return Message("cpu.stacks", 0, offset, b"n1", "fleetprof.CpuStackBatch", rec)


def _defs(produced) -> tuple[int, int, int]:
    r = produced.record
    return len(r["stacks"]), len(r["frames"]), sum(s["count"] for s in r["samples"])


def test_definitions_go_out_once_per_commit_and_again_after_an_abort():
    stage, bid = _stage()
    a = [["main", "run", "compute"]]
    b = [["main", "run", "compute"], ["main", "write_out"]]
    first, second = stage.process([_msg(bid, 0, a), _msg(bid, 1, b)])
    assert _defs(first) == (1, 3, 1)
    assert _defs(second) == (1, 1, 2)  # only the new stack, and only its one new frame
    stage.after_abort()
    (again,) = stage.process([_msg(bid, 0, a)])
    assert _defs(again) == (1, 3, 1)  # the aborted output never reached anyone
    stage.after_commit()
    (later,) = stage.process([_msg(bid, 2, b)])
    assert _defs(later) == (1, 1, 2)  # compute's stack was committed; write_out's was only in the aborted batch
    stage.after_commit()
    (last,) = stage.process([_msg(bid, 3, b)])
    assert _defs(last) == (0, 0, 2)


def _decode(value: bytes, offset: int, registry=None):
    """What the runner makes of a cpu.stacks message (its decode, with `registry` standing for the processor's)."""
    from unittest import mock

    from processors.messages import decode_message
    from schemas import single_object
    from tests.fuzz.targets import Raw

    with mock.patch.object(single_object, "_default", registry) if registry else _nothing():
        return decode_message("symbolize", Raw(value, "cpu.stacks", b"n1", 0, offset),
                              {"cpu.stacks": "CpuStackBatch"}, 1 << 20, columnar=True)


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def test_a_v1_agent_feeds_v3_processors_and_a_v3_batch_is_dead_lettered_by_a_v1_only_one():
    from schemas import single_object
    from schemas.wire import python_frame, u64_to_long

    stage, bid = _stage()
    paths = [["main", "run", "compute"], ["main", "write_out"]]
    batch = cpu_batch("n1", bid, 10**18, [stack(p, 2, tid=i) for i, p in enumerate(paths)])
    v1 = single_object.encode("CpuStackBatch", batch, version=1)
    v2 = single_object.encode("CpuStackBatch", batch)
    assert v1[2:10] != v2[2:10]  # two writer schemas (v2 stands for the newest here)
    old, new = _decode(v1, 0), _decode(v2, 1)
    assert isinstance(old, Message) and isinstance(new, Message)
    (from_v1,) = stage.process([old])
    stage.after_abort()
    (from_v2,) = stage.process([new])
    assert from_v1.record["samples"] == from_v2.record["samples"] and from_v1.record["stacks"]
    # a batch with Python frames, read by processors that know only v1: dead-lettered whole, with the reason
    py = dict(batch, processes=[dict(batch["processes"][0], code_objects=[
        {"qualname": "train", "file": "/srv/train.py", "first_line": 3}])])
    py["processes"][0]["stacks"] = [dict(stack(paths[0], 1), user_addrs=[u64_to_long(python_frame(0, 4))])]
    value = single_object.encode("CpuStackBatch", py)
    v1_only = single_object.SchemaRegistry()
    for path in sorted(single_object.SCHEMA_DIR.glob("*.v*.avsc")):
        if not path.name.startswith("cpu_stack_batch.") or path.name == "cpu_stack_batch.v1.avsc":
            v1_only.register_file(path)
    dead = _decode(value, 2, v1_only)
    assert dead.topic == "deadletter" and dead.record["value"] == value
    assert dead.record["reason"] == f"unknown schema fingerprint {value[2:10][::-1].hex()}"


def test_each_sample_keeps_its_process_identity_and_a_v2_batch_reads_as_none():
    from schemas import single_object
    from schemas.wire import identity_key

    stage, bid = _stage()
    batch = cpu_batch("n1", bid, 10**18, [stack(["main", "run"], 3)])
    proc = batch["processes"][0]
    twin = dict(proc, pid=proc["pid"] + 1, identity_id=-5)  # a negative long: an id of 2**64 - 5
    with_ids = dict(batch, processes=[dict(proc, identity_id=77), twin])
    (out,) = stage.process([_decode(single_object.encode("CpuStackBatch", with_ids), 0)])
    assert sorted((s["pid"], s["identity_id"], s["count"]) for s in out.record["samples"]) == [
        (proc["pid"], 77, 3), (proc["pid"] + 1, -5, 3)]
    assert {identity_key(s["identity_id"]) for s in out.record["samples"]} == {"000000000000004d", "fffffffffffffffb"}
    stage.after_commit()
    old = single_object.encode("CpuStackBatch", batch, version=2)  # an agent before identities
    (out,) = stage.process([_decode(old, 1)])
    assert [(s["pid"], s["identity_id"], s["count"]) for s in out.record["samples"]] == [(proc["pid"], 0, 3)]
    back = single_object.decode(single_object.encode("CpuSamples", out.record))[1]
    assert back["samples"][0]["identity_id"] == 0
