"""Giving memory back to the kernel, so the always-on agent's resident set stays small.

Compiling the BPF program pulls LLVM and clang into the process (~90 MB of their pages resident, ~60 MB of freed
heap kept by malloc); none of it is touched again until the next compile. Both calls are hints: pages come back on
demand if the code runs again, and failures (an old kernel without MADV_PAGEOUT) change nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("fleetprof.memory")

MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now (clean file pages are just dropped, re-read on access)
COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc")

_libc = None


def _c() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except OSError:
            _libc = False
    return _libc or None


def trim_heap() -> None:
    """Return malloc's free memory at the top of each arena to the kernel (glibc only; else nothing)."""
    libc = _c()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def page_out(path_parts: tuple[str, ...] = COMPILER_LIBRARIES) -> int:
    """Ask the kernel to reclaim the pages of mapped files whose path contains one of `path_parts`; bytes advised."""
    libc = _c()
    if libc is None:
        return 0
    advised = 0
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not any(p in parts[5] for p in path_parts):
            continue
        lo, _, hi = parts[0].partition("-")
        start, limit = int(lo, 16), int(hi, 16)
        if libc.madvise(start, limit - start, MADV_PAGEOUT) == 0:
            advised += limit - start
        else:
            log.debug("madvise(MADV_PAGEOUT) on %s failed: errno %d", parts[5], ctypes.get_errno())
    return advised


def release_after_compile() -> None:
    """Drop what the BPF compile left behind: freed heap, and the compiler libraries' pages."""
    trim_heap()
    page_out()
