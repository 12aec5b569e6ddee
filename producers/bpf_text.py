"""A BPF C source as bcc must be given it: the project's own headers (`#include "x.bpf.h"`) written out in place.

bcc turns map calls (`table.lookup(...)`) into helper calls only in the main file; a map call left in an included
header compiles to an indirect call, which the kernel refuses.
"""

from __future__ import annotations

import re
from pathlib import Path

_LOCAL_INCLUDE = re.compile(r'^#include "([\w.]+\.bpf\.h)"\s*$', re.MULTILINE)


def bpf_text(source: Path) -> bytes:
    """The text of `source` with each local `.bpf.h` include replaced by that header (once; headers do not nest)."""
    text = source.read_text()

    def expand(match: re.Match[str]) -> str:
        header = source.parent / match.group(1)
        return f'#line 1 "{header.name}"\n{header.read_text()}\n#line {text.count(chr(10), 0, match.start()) + 2} ' \
               f'"{source.name}"\n'
    return _LOCAL_INCLUDE.sub(expand, text).encode()
