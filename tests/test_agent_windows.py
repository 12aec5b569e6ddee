"""The agent's windows: each starts where the one before ended, however long building that one's records took (the
sampler's maps hold what it counted meanwhile), aligned windows end on their boundary's side, and after a stall of
more than two windows the next one starts afresh."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from producers.agent import Agent, Records, Window


class SlowCollector:
    """A collector whose window's end takes `work_s` seconds (reading a storm of new processes), `stall_s` once."""

    name = "slow"

    def __init__(self, work_s: float, stall_s: float = 0.0, stall_at: int = 0) -> None:
        self.work_s, self.stall_s, self.stall_at = work_s, stall_s, stall_at

    def begin(self, wake: Callable[[], None]) -> None:
        pass

    def look(self) -> None:
        pass

    def due_in(self) -> float | None:
        return None

    def drain(self) -> list[Records]:
        return []

    def end_window(self, window: Window) -> list[Records]:
        time.sleep(self.stall_s if window.index == self.stall_at else self.work_s)
        return []

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


class NoOutlet:
    pending = False

    def put(self, records: Records) -> None:
        pass

    def pump(self) -> None:
        pass


def windows_of(collector: SlowCollector, count: int, window_s: float, align: bool = False) -> list[Window]:
    seen: list[Window] = []
    stop = threading.Event()

    def on_window(window: Window, _report: object) -> None:
        seen.append(window)
        if len(seen) == count:
            stop.set()

    Agent([collector], NoOutlet(), window_s, look_every_s=10.0, on_window=on_window, align=align).run(stop)
    return seen


def test_windows_follow_each_other_without_gaps_however_long_the_work_between_them():
    windows = windows_of(SlowCollector(work_s=0.3), 4, window_s=0.5)
    assert [w.start_ns for w in windows[1:]] == [w.end_ns for w in windows[:-1]]
    # each the length asked, the work before it included: it ends half a second after the last one did
    lengths = [(w.end_ns - w.start_ns) / 1e9 for w in windows]
    assert all(0.5 <= length < 0.65 for length in lengths), lengths


def test_aligned_windows_end_on_their_boundary_and_the_next_starts_there():
    windows = windows_of(SlowCollector(work_s=0.05), 3, window_s=1.0, align=True)
    assert [w.start_ns for w in windows[1:]] == [w.end_ns for w in windows[:-1]]
    # every end at a whole second or just after it, never before: the next window's rows are labelled by the second
    # its start falls in, the boundary's
    assert all(w.end_ns % 1_000_000_000 < 100_000_000 for w in windows), [w.end_ns for w in windows]


def test_after_a_stall_of_more_than_two_windows_the_next_window_starts_afresh():
    windows = windows_of(SlowCollector(work_s=0.0, stall_s=1.3, stall_at=2), 4, window_s=0.5)
    assert windows[1].start_ns == windows[0].end_ns and windows[3].start_ns == windows[2].end_ns
    gap = (windows[2].start_ns - windows[1].end_ns) / 1e9
    assert gap >= 1.3, gap
    assert (windows[2].end_ns - windows[2].start_ns) / 1e9 < 0.65
