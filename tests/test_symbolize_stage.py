"""The symbolize stage sends each stack and frame definition once per commit, and again after an abort."""

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
