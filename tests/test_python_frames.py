"""Python frames put in place of the evaluator's native frames (producers/python_frames.py), on made-up stacks
whose right order is known: native → Python → C extension → native library → Python callback."""

from __future__ import annotations

from producers.python_frames import PY_ENTRY, PY_MARK, merge, runs, split_raw
from schemas.wire import TRUNCATED_FRAME, is_python_frame, python_frame, python_frame_parts

EVAL = (0x1000, 0x2000)  # _PyEval_EvalFrameDefault's addresses


def _raw(code: int, units: int = 0, entry: bool = False) -> int:
    return code | units << 48 | (PY_ENTRY if entry else 0)


def _named(f: tuple[int, int, bool]) -> str:
    return f"py{f[0]:x}"  # stands for the wire word: readable in the asserts


def test_the_raw_part_splits_off_with_its_mark_and_cut() -> None:
    user = [0x1100, 0x500, PY_MARK, _raw(0xA0, 3), _raw(0xB0, 0x7FFF, True), TRUNCATED_FRAME]
    native, frames, cut = split_raw(user)
    assert native == [0x1100, 0x500]
    assert frames == [(0xA0, 3, False), (0xB0, 0x7FFF, True)] and cut
    assert split_raw([1, 2]) == ([1, 2], [], False)


def test_runs_end_at_entry_frames() -> None:
    frames = [(1, 0, False), (2, 0, True), (3, 0, True), (4, 0, False)]
    assert runs(frames) == [[(1, 0, False), (2, 0, True)], [(3, 0, True)], [(4, 0, False)]]


def test_each_evaluator_frame_is_replaced_by_its_run_in_order() -> None:
    # leaf first: a Python callback (cb) called from a native library (lib_fn) called by a C extension (ext_fn)
    # that a Python function (train -> step) called, from main's Python code, from a native main
    native = [0x1500, 0x7000, 0x7100, 0x1400, 0x1300, 0x9000]  # eval, lib_fn, ext_fn, eval, eval, main
    frames = [(0xCB, 0, True), (0x5E, 0, False), (0x7A, 0, True), (0x3A, 0, True)]
    merged, whole = merge(native, frames, *EVAL, _named)
    assert merged == ["pycb", 0x7000, 0x7100, "py5e", "py7a", "py3a", 0x9000] and whole


def test_runs_left_over_go_to_the_root_end_before_the_mark() -> None:
    native = [0x1500, 0x7000, TRUNCATED_FRAME]  # the native walk was cut before the outer evaluator frames
    frames = [(0xCB, 0, True), (0x5E, 0, True), (0x3A, 0, False)]
    merged, whole = merge(native, frames, *EVAL, _named)
    assert merged == ["pycb", 0x7000, "py5e", "py3a", TRUNCATED_FRAME] and not whole
    # more evaluator frames than runs: the extra ones stay native
    merged, whole = merge([0x1500, 0x1600], [(0xCB, 0, True)], *EVAL, _named)
    assert merged == ["pycb", 0x1600] and whole


def test_wire_words_carry_index_and_line_and_are_no_address() -> None:
    word = python_frame(0xABCDEF, 123_456)
    assert is_python_frame(word) and python_frame_parts(word) == (0xABCDEF, 123_456)
    assert not is_python_frame(TRUNCATED_FRAME) and not is_python_frame(0x7FFF_FFFF_F000)
    assert python_frame_parts(python_frame(0, -5)) == (0, 0)
