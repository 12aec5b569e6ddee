"""Giving the BPF compiler's memory back: page_out drops a mapped file's resident pages, and they come back on use."""

from __future__ import annotations

import mmap
from pathlib import Path

from producers.memory import page_out, trim_heap


def _resident_kb(path: Path) -> int:
    """Rss of this process's mappings of `path`, from /proc/self/smaps."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_page_out_drops_a_mapped_files_pages_and_reading_brings_them_back(tmp_path: Path) -> None:
    data = tmp_path / "fpcompiler-lib.bin"
    data.write_bytes(bytes(range(256)) * 4096 * 4)  # 4 MiB
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        checksum = sum(m[i] for i in range(0, len(m), 4096))  # touch every page
        assert _resident_kb(data) >= 4000
        assert page_out(("fpcompiler-lib",)) >= 4 << 20
        assert _resident_kb(data) < 1000
        assert sum(m[i] for i in range(0, len(m), 4096)) == checksum  # contents intact, read back on demand
        assert _resident_kb(data) >= 4000


def test_page_out_of_nothing_mapped_and_trim_heap_are_harmless() -> None:
    assert page_out(("no-such-library-mapped-here",)) == 0
    trim_heap()
