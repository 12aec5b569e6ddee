"""The node agent: its collectors on one thread and one schedule, their records into one outbox.

`Agent(collectors, outbox).run(stop)` runs reporting windows until `stop` is set (or one window, `once`); aligned,
they end on multiples of the window length in Unix time (the first one, partial, within FIRST_WINDOW_S). The loop
is the only place that decides when a collector is looked at and drained:
- every `look_every_s` each collector looks around (the CPU sampler empties its kernel maps, so fewer stacks
  collide, and reads newly sampled processes; the GPU probes attach to new objects);
- a collector that says it is due (the GPU probes' rings every 100 ms while something is attached, NVML on its
  period, the CPU sampler when a new process was announced: it wakes the loop from its ring's thread) is drained
  then, and every collector at the window's end;
- whatever a drain returns goes to the outbox at once, and the outbox is pumped on every tick (it never waits).
Between those the loop sleeps: an idle agent wakes about once a second. One thread on purpose (the collectors' ring
readers only hand over pids and wake it): the process cache is shared by the collectors and not locked, and nothing
here blocks for long (an NVML call that hangs is cut off by the collector's own deadline; Kafka is watched by a thread
of its own).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event
from typing import Protocol

log = logging.getLogger("fleetprof.agent")

FIRST_WINDOW_S = 2.0  # aligned windows: the first one ends this soon, so a new node shows up within seconds
EXIT_NOTHING_TO_COLLECT = 3  # the agent's exit status when nothing can run on this node (a supervisor: do not restart)


@dataclass(frozen=True)
class Window:
    index: int  # 1, 2, ...
    start_ns: int  # Unix ns
    end_ns: int


@dataclass
class Records:
    kind: str  # cpu (CpuStackBatch), gpu_launches, gpu_kernels, gpu_metrics
    records: list[dict]


class Collector(Protocol):
    """One source of records on the node."""

    name: str  # "cpu", "gpu", "nvml": said in logs and counters

    def begin(self, wake: Callable[[], None]) -> None:
        """Start the first window now: what was counted while the others started is dropped. `wake` (callable from
        any thread) makes the agent ask due_in() now rather than at its next planned tick."""

    def look(self) -> None:
        """Every second or so: find what is new (processes, loaded objects)."""

    def due_in(self) -> float | None:
        """Seconds until it wants draining (<= 0: now); None: only at the window's end."""

    def drain(self) -> list[Records]:
        """The records collected since the last drain."""

    def end_window(self, window: Window) -> list[Records]:
        """Close the window: the records that belong to it as a whole (the CPU batch)."""

    def counters(self) -> dict[str, int]:
        """What it counted: lost, dropped, unreadable."""

    def close(self) -> None:
        """Stop and release; safe to call twice."""


class Outlet(Protocol):
    """Where records go: the outbox to Kafka, or the dry run's printer."""

    def put(self, records: Records) -> None: ...

    def pump(self) -> None:
        """Move held records along without waiting."""

    @property
    def pending(self) -> bool:
        """Whether it holds records it could move along (then the loop ticks more often)."""


@dataclass
class AgentReport:
    windows: int = 0
    records: dict[str, int] = field(default_factory=dict)  # by kind: records put
    started: float = field(default_factory=time.monotonic)


class Agent:
    """Runs windows over `collectors`, putting their records into `outbox` as they come."""

    def __init__(self, collectors: list[Collector], outbox: Outlet, window_s: float = 10.0, tick_s: float = 0.1,
                 look_every_s: float = 1.0, on_window: Callable[[Window, AgentReport], None] | None = None,
                 align: bool = False) -> None:
        if not collectors:
            raise ValueError("an agent needs at least one collector")
        self.collectors = collectors
        self.outbox = outbox
        self.window_s = window_s
        self._window_ns = round(window_s * 1e9)
        self.tick_s = tick_s
        self.look_every_s = look_every_s
        self.on_window = on_window
        self.align = align
        self.report = AgentReport()
        self._begun = False
        self._wake = threading.Event()  # set by a collector, or by `stop`
        self._last_end_ns: int | None = None  # where the last window ended (Unix ns)

    def _put(self, found: list[Records]) -> None:
        for records in found:
            if records.records:
                self.report.records[records.kind] = self.report.records.get(records.kind, 0) + len(records.records)
                self.outbox.put(records)

    def begin(self) -> None:
        """Start counting in every collector (run() does it when not done yet): once this returns, the CPU sampler
        counts for the first window and the GPU probes are attached to every object that has them."""
        if not self._begun:
            self._begun = True
            for c in self.collectors:
                c.begin(self._wake.set)

    def run(self, stop: Event, once: bool = False) -> AgentReport:
        """Windows until `stop` is set (it ends the current window early; its records still go), or one."""
        self.begin()
        # the loop sleeps on its wake event: `stop` sets it through a thread that waits for nothing else
        threading.Thread(target=lambda: (stop.wait(), self._wake.set()), name="fleetprof-agent-stop",
                         daemon=True).start()
        while True:
            window = self._window(stop)
            self.report.windows += 1
            if self.on_window is not None:
                self.on_window(window, self.report)
            if once or stop.is_set():
                return self.report

    def _length_ns(self, start_ns: int) -> int:
        """This window's length: up to the next multiple of window_s in Unix time when aligned (every node's windows
        then cover the same 10 s), at least a second; the first one at most FIRST_WINDOW_S."""
        window_ns = self._window_ns
        if not self.align:
            return window_ns
        left = window_ns - start_ns % window_ns
        if self.report.windows == 0 and left > FIRST_WINDOW_S * 1e9:  # a first look at the node soon after start
            return round(FIRST_WINDOW_S * 1e9)
        return left if left >= min(1e9, window_ns / 2) else left + window_ns

    def _start_ns(self, now_ns: int) -> int:
        """Where the last window ended: the sampler's maps hold what it counted while that window's batch was being
        built (half a second when a storm of new processes must be read on a busy node), so the windows cover the
        node's time without gaps. Now, for the first window, after the wall clock stepped back, or after a stall of
        more than two windows (such a window would say little about when its samples were taken)."""
        last = self._last_end_ns
        if last is None or not last <= now_ns <= last + 2 * self._window_ns:
            return now_ns
        return last

    def _window(self, stop: Event) -> Window:
        now_ns, now = time.time_ns(), time.monotonic()
        start_ns = self._start_ns(now_ns)
        end_by_ns = start_ns + self._length_ns(start_ns)
        deadline, next_look = now + (end_by_ns - now_ns) / 1e9, now + self.look_every_s
        while (left := deadline - time.monotonic()) > 0:
            due = [d for c in self.collectors if (d := c.due_in()) is not None]
            if self.outbox.pending:
                due.append(self.tick_s)
            wait = min([left, max(0.0, next_look - time.monotonic()), *due])
            if self._wake.wait(max(0.0, wait)):
                self._wake.clear()
            if stop.is_set():
                break
            for c in self.collectors:
                d = c.due_in()
                if d is not None and d <= 0:
                    self._put(c.drain())
            if time.monotonic() >= next_look:
                next_look += self.look_every_s
                for c in self.collectors:
                    c.look()
            self.outbox.pump()
        end_ns = time.time_ns()
        if end_ns < end_by_ns and not stop.is_set():
            # the monotonic deadline came a little before the wall clock's: end on the boundary's side, or the next
            # window would start (and its rows be labelled) a second early
            time.sleep((end_by_ns - end_ns) / 1e9)
            end_ns = time.time_ns()
        window = Window(self.report.windows + 1, start_ns, end_ns)
        self._last_end_ns = end_ns
        for c in self.collectors:
            self._put(c.drain())
            self._put(c.end_window(window))
        self.outbox.pump()
        return window
