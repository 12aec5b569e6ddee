"""A bounded memory of ids already made durable downstream, refreshed after an interval."""

from __future__ import annotations

import time
from collections import OrderedDict


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
