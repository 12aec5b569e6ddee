"""`PackedStacks`: the StackCount items of one process held columnar (numpy arrays, no dict per stack), as the fast
CPU-batch writer takes them and the columnar reader returns them, and the array helpers both use.

Imports nothing else of schemas/: cpu_batch_layout.py checks at import that the schema's StackCount has
exactly the fields named here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# StackCount's fields as PackedStacks holds them: a number is one column; an address array is two, every stack's
# addresses one after another and their count per stack.
NUMBER_COLUMNS = {"tid": "tids", "count": "counts"}
ADDRESS_COLUMNS = {"user_addrs": ("user_addrs", "user_lens"), "kernel_addrs": ("kernel_addrs", "kernel_lens")}


def concat_ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), without a Python loop."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lens)
    return np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lens), lens)


def lengths_to_offsets(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


@dataclass
class PackedStacks:
    """The StackCount items of one process, columnar. Addresses are Avro longs, leaf first per stack."""

    tids: np.ndarray  # int64 [n]
    counts: np.ndarray  # int64 [n]
    user_addrs: np.ndarray  # int64, all stacks' user addresses one after another
    user_lens: np.ndarray  # int64 [n]
    kernel_addrs: np.ndarray
    kernel_lens: np.ndarray

    def __len__(self) -> int:
        return len(self.tids)

    @classmethod
    def from_records(cls, stacks: list[dict]) -> PackedStacks:
        columns = {col: np.array([s[name] for s in stacks], dtype=np.int64) for name, col in NUMBER_COLUMNS.items()}
        for name, (flat, lens) in ADDRESS_COLUMNS.items():
            arrays = [np.asarray(s[name], dtype=np.int64) for s in stacks]
            columns[flat] = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
            columns[lens] = np.array([len(a) for a in arrays], dtype=np.int64)
        return cls(**columns)

    def records(self) -> list[dict]:
        """The StackCount dicts."""
        fields = {name: getattr(self, col).tolist() for name, col in NUMBER_COLUMNS.items()}
        for name, (flat, lens) in ADDRESS_COLUMNS.items():
            offsets, addrs = lengths_to_offsets(getattr(self, lens)).tolist(), getattr(self, flat).tolist()
            fields[name] = [addrs[lo:hi] for lo, hi in zip(offsets, offsets[1:], strict=False)]
        return [dict(zip(fields, values, strict=True)) for values in zip(*fields.values(), strict=True)]

    def select(self, rows: np.ndarray) -> PackedStacks:
        """The stacks at `rows` (indexes, in that order)."""
        uo, ko = lengths_to_offsets(self.user_lens), lengths_to_offsets(self.kernel_lens)
        ulens, klens = self.user_lens[rows], self.kernel_lens[rows]
        return PackedStacks(self.tids[rows], self.counts[rows], self.user_addrs[concat_ranges(uo[rows], ulens)], ulens,
                            self.kernel_addrs[concat_ranges(ko[rows], klens)], klens)

    def take(self, lo: int, hi: int) -> PackedStacks:
        """Stacks lo..hi-1."""
        uo, ko = lengths_to_offsets(self.user_lens), lengths_to_offsets(self.kernel_lens)
        return PackedStacks(self.tids[lo:hi], self.counts[lo:hi], self.user_addrs[uo[lo]:uo[hi]],
                            self.user_lens[lo:hi], self.kernel_addrs[ko[lo]:ko[hi]], self.kernel_lens[lo:hi])
