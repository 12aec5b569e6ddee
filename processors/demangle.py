"""Readable names for C++ (Itanium), Rust (legacy and v0) and Swift symbols, through the demumble library."""

from __future__ import annotations

from functools import lru_cache

import pydemumble


@lru_cache(maxsize=200_000)
def demangle(name: str) -> str:
    """The demangled name, or `name` itself when it is not mangled (C, assembly, CUDA names without _Z)."""
    base, at, version = name.partition("@")
    # nm-style symbol versions (foo@@GLIBCXX_3.4) are not part of the mangling
    readable = pydemumble.demangle(base) if base.startswith(("_Z", "_R", "$s", "_T")) else ""
    if not readable:
        return name
    return f"{readable}@{version}" if at else readable
