"""Compiling a BPF program that walks user stacks with unwind.bpf.h: with the call-frame tables when the kernel
takes them, else (one line says why) by frame pointers, and its walk's continuation put in place for the tail
calls either way."""

from __future__ import annotations

import ctypes as ct
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from producers.bpf_text import bpf_text

if TYPE_CHECKING:
    from producers.unwind_maps import UnwindLoader

log = logging.getLogger("fleetprof.unwind")

FRAME_POINTERS = "frame pointers"
TABLES = "call-frame tables"
_NO_TABLES = ["-DUNWIND_ROWS=1", "-DUNWIND_PROCS=1"]  # the maps exist, unused: as small as they go


def _compile(bcc: Any, source: Path, cflags: list[str], walk: tuple[bytes, ...], prog_type: int) -> Any:
    bpf = bcc.BPF(text=bpf_text(source), cflags=cflags)
    try:
        for i, name in enumerate(walk):
            fn = bpf.load_func(name, prog_type)
            bpf[b"unwind_progs"][ct.c_int(i)] = ct.c_int(fn.fd)
    except Exception:
        bpf.cleanup()
        raise
    return bpf


def load_unwinding_program(bcc: Any, source: Path, cflags: list[str], walk: tuple[bytes, ...], prog_type: int,
                           unwind: UnwindLoader | None, what: str) -> tuple[Any, str]:
    """(the loaded bcc.BPF, how it walks user stacks). `walk` names the programs tail-called through `unwind_progs`, in
    the order of their places there (the native walk's continuation first); `what` says
    whose stacks, in the one line said when the tables are refused. Raises what bcc raises when even the
    frame-pointer build fails."""
    if unwind is not None:
        bpf = None
        try:
            bpf = _compile(bcc, source, cflags + unwind.cflags(shared=unwind.shared), walk, prog_type)
            unwind.attach(bpf)
            return bpf, TABLES
        except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception; the compiler said more on stderr
            log.warning("the table unwinder did not load (%s): %s are walked by frame pointers",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__, what)
            if bpf is not None:
                bpf.cleanup()
    return _compile(bcc, source, cflags + _NO_TABLES, walk, prog_type), FRAME_POINTERS
