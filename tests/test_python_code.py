"""Code objects read from another CPython process's memory, and lines from their location tables.

Lines: the 3.11+ location table decoded here against the running interpreter's own `co_lines()` for every function
of a few standard modules (this test's interpreter is a 3.11: the table's format is the same through 3.13).
Code objects: a stock interpreter (Debian's python3.11, no frame pointers) prints where its code objects are; what
is read from its memory matches what it says about them, non-ASCII names and long paths included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from producers.python_code import MAX_STRING_CHARS, ProcessMemory, ReadFailed, line_at, read_code, still_same
from producers.python_offsets import TABLE
from producers.python_runtime import read_python_runtime
from tests.elf_helpers import unavailable

STOCK = Path("/usr/bin/python3.11")


def _code_objects(module: types.ModuleType) -> list[types.CodeType]:
    out, todo = [], [v.__code__ for v in vars(module).values() if isinstance(v, types.FunctionType)]
    todo += [f.__code__ for cls in vars(module).values() if isinstance(cls, type)
             for f in vars(cls).values() if isinstance(f, types.FunctionType)]
    while todo:
        code = todo.pop()
        out.append(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return out


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the location table of 3.11-3.13 is checked on a 3.11")
def test_lines_match_co_lines_for_every_instruction() -> None:
    checked = 0
    for module in (json, argparse, asyncio.tasks, subprocess):
        for code in _code_objects(module):
            for start, end, line in code.co_lines():
                if line is None:
                    continue
                for unit in range(start // 2, end // 2):
                    assert line_at(code.co_linetable, code.co_firstlineno, unit) == line, (code, unit)
                    checked += 1
    assert checked > 20_000


def test_a_table_cut_short_gives_the_last_line_it_reached() -> None:
    def f(x):
        y = x + 1
        return y * 2
    table = f.__code__.co_linetable
    last = max(line for _, _, line in f.__code__.co_lines() if line is not None)
    assert line_at(table[:-1], f.__code__.co_firstlineno, 10_000) in range(f.__code__.co_firstlineno, last + 1)
    assert line_at(b"", 42, 3) == 42


CHILD = r"""
import sys
class Modèle:
    def forward(self):
        return 1
def {long_name}():
    pass
print(id(Modèle.forward.__code__), id({long_name}.__code__), flush=True)
sys.stdin.read()
"""


def test_code_objects_are_read_from_a_stock_interpreter(tmp_path) -> None:
    if not STOCK.exists():
        unavailable(f"no {STOCK} (bash infra/setup.sh installs Debian's python3.11)")
    runtime = read_python_runtime(str(STOCK))
    assert runtime is not None and runtime.offsets == TABLE[(3, 11)]
    long_name = "f" + "x" * (MAX_STRING_CHARS + 20)
    script = tmp_path / ("dossier_é" + "/d" * 40) / "work.py"
    script.parent.mkdir(parents=True)
    script.write_text(CHILD.replace("{long_name}", long_name))
    child = subprocess.Popen([str(STOCK), "-S", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        forward, long_one = (int(x) for x in child.stdout.readline().split())
        mem = ProcessMemory(child.pid)
        try:
            code = read_code(mem, runtime.offsets, forward)
            assert (code.qualname, code.filename, code.first_line) == ("Modèle.forward", str(script), 4)
            assert code.line_at(0) in (4, 5)
            cut = read_code(mem, runtime.offsets, long_one)
            assert cut.qualname == long_name[:MAX_STRING_CHARS] + "…"
            assert still_same(mem, runtime.offsets, forward, code)
            assert not still_same(mem, runtime.offsets, long_one, code)
            with pytest.raises(ReadFailed):
                read_code(mem, runtime.offsets, 8)  # no memory there
        finally:
            mem.close()
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ReadFailed, match=f"pid {child.pid}"):
        ProcessMemory(child.pid)
