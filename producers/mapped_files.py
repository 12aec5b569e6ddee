"""The file behind an executable mapping, as the agent reads it, and where the mapping put its addresses."""

from __future__ import annotations

from producers.elf_symbols import ElfError, read_build_id
from producers.process_info import DELETED, Mapping, mapped_file


def file_of_mapping(pid: int, m: Mapping) -> str | None:
    """Where the file a mapping maps is read: its path through the process's root, unless that path holds another
    file by now (an upgrade renamed a new binary over it after the mappings were read: the table would be the new
    file's, under the old build id), then the mapped inode itself through map_files. None when neither is it."""
    for path in dict.fromkeys((mapped_file(pid, m.start, m.limit, m.path),
                               mapped_file(pid, m.start, m.limit, m.path.removesuffix(DELETED) + DELETED))):
        try:
            if read_build_id(path) == m.build_id:
                return path
        except ElfError:
            pass
    return None


def load_bias(segments: list[tuple[int, int, int]], start: int, file_offset: int) -> int | None:
    """pc - bias = the file's virtual address, for a mapping of the file at `file_offset` placed at `start`:
    from the loadable segment (offset, vaddr, size) holding that offset."""
    for offset, vaddr, size in segments:
        if offset <= file_offset < offset + max(size, 1):
            return (start - file_offset + offset - vaddr) % (1 << 64)
    return None
