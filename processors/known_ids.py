"""A bounded memory of ids already made durable downstream, refreshed after an interval."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable


class KnownIds:
    """Ids of frames/stacks already durable in the store, so they are not written again (bounded LRU).

    An id is written again after `refresh_s`, which moves its last_seen forward: the definitions' TTL is longer
    than the samples', so a definition in use never expires before the samples that point at it.
    """

    def __init__(self, limit: int = 1_000_000, refresh_s: float = 24 * 3600.0) -> None:
        self.limit = limit
        self.refresh_s = refresh_s
        self._ids: OrderedDict[int, float] = OrderedDict()

    def unseen(self, ids: list[int], now: float | None = None) -> set[int]:
        horizon = (time.monotonic() if now is None else now) - self.refresh_s
        return {i for i in ids if self._ids.get(i, horizon - 1) < horizon}

    def add(self, ids: set[int], now: float | None = None) -> None:
        stamp = time.monotonic() if now is None else now
        for i in ids:
            self._ids[i] = stamp
            self._ids.move_to_end(i)
        while len(self._ids) > self.limit:
            self._ids.popitem(last=False)


class SentDefinitions:
    """The stack and frame definitions a stage has put in committed output, so each goes out once (then again
    after `resend_s`, which keeps its last_seen fresh in the store). Ids of a batch stay pending until its
    transaction commits: an aborted batch's definitions must go out again with the retried batch."""

    def __init__(self, resend_s: float = 3600.0) -> None:
        self.stacks = KnownIds(refresh_s=resend_s)
        self.frames = KnownIds(refresh_s=resend_s)
        self.pending_stacks: set[int] = set()
        self.pending_frames: set[int] = set()

    def new_only(self, rec: dict) -> dict:
        """`rec` (with "stacks" and "frames") keeping only the definitions not sent yet."""
        frame_ids = {s["stack_id"]: s["frame_ids"] for s in rec["stacks"]}
        stacks, frames = self.new_ids(list(frame_ids), frame_ids.__getitem__)
        kept = set(stacks)
        return {**rec, "stacks": [s for s in rec["stacks"] if s["stack_id"] in kept],
                "frames": [f for f in rec["frames"] if f["frame_id"] in frames]}

    def new_ids(self, stack_ids: list[int], frames_of: Callable[[int], Iterable[int]]) -> tuple[list[int], set[int]]:
        """Of `stack_ids` (in order), those not sent yet, and the not yet sent frames they name; both pending from
        now on: a caller builds only these definitions."""
        stacks, frames = self.unsent_ids(stack_ids, frames_of)
        self.pend(stacks, frames)
        return stacks, frames

    def unsent_ids(self, stack_ids: list[int], frames_of: Callable[[int], Iterable[int]]
                   ) -> tuple[list[int], set[int]]:
        """new_ids without making them pending: what the output would carry, to size it first."""
        unseen = self.stacks.unseen(stack_ids) - self.pending_stacks
        stacks = [s for s in stack_ids if s in unseen]
        return stacks, self.frames.unseen([f for s in stacks for f in frames_of(s)]) - self.pending_frames

    def pend(self, stack_ids: list[int], frame_ids: set[int]) -> None:
        """These definitions go out in the batch in hand (unsent_ids gave them)."""
        self.pending_stacks.update(stack_ids)
        self.pending_frames |= frame_ids

    def commit(self) -> None:
        self.stacks.add(self.pending_stacks)
        self.frames.add(self.pending_frames)
        self.pending_stacks, self.pending_frames = set(), set()

    def abort(self) -> None:
        self.pending_stacks, self.pending_frames = set(), set()
