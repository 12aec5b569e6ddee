"""Readable names for C++ (Itanium), Rust (legacy and v0) and Swift symbols, through the demumble library.

Names come from binaries and CUDA kernels that anyone on a node may build, so they are hostile input. The
demangler recurses once per nesting level (tens of thousands of levels overflow the C stack: the process dies)
and back-references let a few hundred bytes demangle into gigabytes. So a name is only demangled when it is
short enough and its back-references cannot blow it up; otherwise, or when the result is huge anyway, it stays
mangled.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

import pydemumble

# Measured: ~8,000 nested local names (16 KB) overflow an 8 MB stack; real names stay far below (the longest of
# ~57,000 C++ symbols in Debian's libraries is 604 characters).
MAX_MANGLED = 4096
# Each doubling of the output takes about two back-references, so len * 2^(refs/2) bounds it up to a small factor.
# 2^22 leaves 8 of those ~57,000 names mangled and keeps a crafted one to a few MB and milliseconds.
MAX_LOG2_ESTIMATE = 22
MAX_DEMANGLED = 64 * 1024
# back-references of each scheme (over-counted where identifiers contain the same letters: only more cautious)
_REFS = {"_Z": re.compile(r"[ST][0-9A-Z]*_"), "_R": re.compile(r"B[0-9a-zA-Z]*_"),
         "$s": re.compile(r"A[0-9]*[A-Za-z]"), "_T": re.compile(r"A[0-9]*[A-Za-z]")}


def safe_to_demangle(name: str) -> bool:
    """Whether demangling `name` is bounded in stack depth and output size."""
    if len(name) > MAX_MANGLED:
        return False
    refs = len(_REFS[name[:2]].findall(name, 2))
    return math.log2(max(len(name), 1)) + refs / 2 <= MAX_LOG2_ESTIMATE


@lru_cache(maxsize=200_000)
def demangle(name: str) -> str:
    """The demangled name, or `name` itself when it is not mangled (C, assembly, CUDA names without _Z), or when
    demangling it would not be safe (see the module doc)."""
    base, at, version = name.partition("@")
    # nm-style symbol versions (foo@@GLIBCXX_3.4) are not part of the mangling
    if not base.startswith(("_Z", "_R", "$s", "_T")) or not safe_to_demangle(base):
        return name
    readable = pydemumble.demangle(base)
    if not readable or len(readable) > MAX_DEMANGLED:
        return name
    return f"{readable}@{version}" if at else readable
