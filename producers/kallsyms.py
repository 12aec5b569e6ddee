"""The kernel's symbol table (/proc/kallsyms) as SymbolChunk records (kind KERNEL), one table per boot.

Addresses are absolute kernel virtual addresses (the symbolizer looks kernel frames up without any mapping), sizes
are 0 so each symbol extends to the next. Module symbols are included; their `[module]` suffix is not part of the
name. Zero addresses mean kptr_restrict hides them from this reader: those lines are skipped, so an unprivileged
reader gets an empty table rather than a wrong one.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass

from producers.symbol_chunks import chunk_symbol_table
from schemas.wire import DEFAULT_MAX_BYTES, KERNEL_BINARY, u64_to_long

KALLSYMS = "/proc/kallsyms"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
TEXT_TYPES = frozenset("tTwW")


@dataclass
class KernelSymbols:
    build_id: str
    addrs: list[int]  # unsigned, sorted ascending, unique
    names: list[str]
    hidden: int = 0  # text symbols skipped because their address read as zero (kptr_restrict)

    def __len__(self) -> int:
        return len(self.names)


def kernel_build_id(release: str | None = None, boot_id: str | None = None) -> str:
    """"kernel-<release>-<16 hex of sha256(boot id)>": one table per boot (module load addresses change per boot)."""
    release = release if release is not None else platform.release()
    if boot_id is None:
        try:
            with open(BOOT_ID) as f:
                boot_id = f.read().strip()
        except OSError:
            boot_id = ""
    return f"kernel-{release}-{hashlib.sha256(boot_id.encode()).hexdigest()[:16]}"


def parse_kallsyms(text: str) -> tuple[list[int], list[str], int]:
    """(addresses, names, hidden) of the text symbols in kallsyms text, sorted by address, one name per address
    (the first seen: kallsyms lists the canonical symbol first, e.g. _stext before _text)."""
    by_addr: dict[int, str] = {}
    hidden = 0
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 3 or parts[1] not in TEXT_TYPES:
            continue
        try:
            addr = int(parts[0], 16)
        except ValueError:
            continue
        if addr == 0:
            hidden += 1
            continue
        if addr >> 64:  # not an address (a 64-bit kernel's are 16 hex digits at most)
            continue
        by_addr.setdefault(addr, parts[2])  # the 4th field, if any, is "[module]"
    addrs = sorted(by_addr)
    return addrs, [by_addr[a] for a in addrs], hidden


def read_kallsyms(path: str = KALLSYMS, build_id: str | None = None) -> KernelSymbols:
    """This kernel's text symbols; OSError propagates (no /proc/kallsyms is the caller's to report)."""
    with open(path) as f:
        addrs, names, hidden = parse_kallsyms(f.read())
    return KernelSymbols(build_id or kernel_build_id(), addrs, names, hidden)


def kernel_symbol_chunks(syms: KernelSymbols, max_bytes: int | None = DEFAULT_MAX_BYTES) -> list[dict]:
    """SymbolChunk records (kind KERNEL), each encoding to at most `max_bytes` (None: one chunk)."""
    addrs = [u64_to_long(a) for a in syms.addrs]
    return chunk_symbol_table(syms.build_id, KERNEL_BINARY, "KERNEL", [], addrs, [0] * len(addrs), syms.names,
                              max_bytes)
