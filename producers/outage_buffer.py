"""The agent's windows on their way to Kafka, held within a memory bound while Kafka is unreachable.

Windows leave in order. librdkafka is handed one step at a time (a window's symbol tables, then a run of batches
that need no new tables), at most `inflight_bytes` of it, and the next step only once the broker acknowledged the
last: whatever librdkafka holds is delivered once (idempotent, no expiry), so it never drops. Whatever waits here
is dropped when the bound is hit, oldest whole windows first; a dropped window's symbol tables move on to the next
window, so no later batch goes out without the tables it needs. Drops are counted, here and in Prometheus counters.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from producers.publisher import Publisher, PublishError

log = logging.getLogger("fleetprof.agent")

Message = tuple[str, str, bytes]  # topic, key, value

DROPPED_WINDOWS = Counter("fleetprof_agent_dropped_windows_total", "Windows dropped from the outage buffer")
DROPPED_MESSAGES = Counter("fleetprof_agent_dropped_messages_total", "Messages dropped from the outage buffer")
DROPPED_BYTES = Counter("fleetprof_agent_dropped_bytes_total", "Message bytes dropped from the outage buffer")
DROPPED_SAMPLES = Counter("fleetprof_agent_dropped_samples_total", "CPU samples dropped from the outage buffer")
BUFFERED_BYTES = Gauge("fleetprof_agent_buffered_bytes", "Message bytes waiting for Kafka (held and in flight)")


@dataclass
class HeldWindow:
    """One window's messages: symbol tables first (delivered before any batch is handed over), then batches."""

    symbols: list[Message]
    batches: list[Message]
    samples: int
    processes: int = 0
    new_build_ids: int = 0

    @property
    def bytes(self) -> int:
        return sum(len(v) for _, _, v in self.symbols) + sum(len(v) for _, _, v in self.batches)


class OutageBuffer:
    """Ships HeldWindows in order through `publisher`, holding at most `max_bytes` of them while Kafka is away."""

    def __init__(self, publisher: Publisher, max_bytes: int, inflight_bytes: int = 16 << 20) -> None:
        self.publisher = publisher
        self.max_bytes = max_bytes
        self.inflight_bytes = max(1, min(inflight_bytes, max_bytes // 2))
        self.held: deque[HeldWindow] = deque()
        self.held_bytes = 0
        self._step: list[HeldWindow] = []  # windows whose batches are with librdkafka now
        self._step_bytes = 0
        self._unacked = 0  # messages of the current step without a delivery report yet
        self._failed = 0
        self.sent_windows = self.sent_samples = self.sent_messages = self.sent_bytes = 0
        self.dropped_windows = self.dropped_messages = self.dropped_bytes = self.dropped_samples = 0
        self.peak_bytes = 0  # most bytes waiting while Kafka was away
        self._since = 0.0  # when buffering began; 0 while not buffering

    @property
    def pending_bytes(self) -> int:
        return self.held_bytes + self._step_bytes

    def add(self, window: HeldWindow) -> None:
        """Queue a window behind the others; drop the oldest held ones while over the bound (the newest stays).
        What librdkafka holds counts towards the bound but is never dropped."""
        self.held.append(window)
        self.held_bytes += window.bytes
        dropped = samples = 0
        while self.pending_bytes > self.max_bytes and len(self.held) > 1:
            old = self.held.popleft()
            self.held[0].symbols[:0] = old.symbols  # its tables are still owed to the batches after it
            size = sum(len(v) for _, _, v in old.batches)
            self.held_bytes -= size
            dropped, samples = dropped + 1, samples + old.samples
            self.dropped_messages += len(old.batches)
            self.dropped_bytes += size
            DROPPED_MESSAGES.inc(len(old.batches))
            DROPPED_BYTES.inc(size)
        if dropped:
            self.dropped_windows += dropped
            self.dropped_samples += samples
            DROPPED_WINDOWS.inc(dropped)
            DROPPED_SAMPLES.inc(samples)
            log.warning("outage buffer full (%.1f MiB): dropped the %d oldest windows (%d samples); %d windows, "
                        "%d samples dropped so far", self.max_bytes / 2**20, dropped, samples, self.dropped_windows,
                        self.dropped_samples)
        self._note_size()

    @property
    def buffering(self) -> bool:
        """True from a drain that left windows waiting until one that delivered everything."""
        return bool(self._since)

    def _note_size(self) -> None:
        if self._since:  # the peak of what waited for Kafka while it was away, not of ordinary sending
            self.peak_bytes = max(self.peak_bytes, self.pending_bytes)
        BUFFERED_BYTES.set(self.pending_bytes)

    def _acked(self, delivered: bool) -> None:
        self._unacked -= 1
        self._failed += not delivered

    def _hand_over(self) -> None:
        """Give librdkafka the next step: the head window's tables, or a run of batches needing no new tables."""
        head = self.held[0]
        if head.symbols:
            messages, head.symbols = head.symbols, []
        else:
            messages = []
            size = 0
            while self.held and not self.held[0].symbols and (not messages or size < self.inflight_bytes):
                window = self.held.popleft()
                self._step.append(window)
                messages += window.batches
                size += window.bytes
        size = sum(len(v) for _, _, v in messages)
        self.held_bytes -= size
        self._step_bytes = size
        self._unacked = len(messages)
        for topic, key, value in messages:
            self.publisher.publish(topic, key, value, done=self._acked)
        self.sent_messages += len(messages)
        self.sent_bytes += size

    def pump(self) -> bool:
        """Serve delivery reports and hand over the next step when the last is acknowledged; True if it moved."""
        self.publisher.poll(0)
        if self._failed:
            raise PublishError(f"{self._failed} messages failed for good; first: {self.publisher.first_error}")
        if self._unacked:
            return False
        for window in self._step:
            self.sent_windows += 1
            self.sent_samples += window.samples
        self._step, self._step_bytes = [], 0
        if self.held:
            self._hand_over()
        self._note_size()
        return True

    def drain(self, idle_s: float = 2.0, budget_s: float = 60.0) -> bool:
        """Ship what is held until all is acknowledged, nothing was acknowledged for `idle_s` (Kafka away) or
        `budget_s` is spent; True when all is delivered. Logs when buffering starts and when it has drained."""
        start = last = time.monotonic()
        while (self.held or self._step or self._unacked) and time.monotonic() - start < budget_s:
            if self.pump():
                last = time.monotonic()
            elif time.monotonic() - last > idle_s:
                break
            else:
                self.publisher.poll(0.02)
        empty = not (self.held or self._step or self._unacked)
        if not empty and not self._since:
            self._since = time.monotonic()
            self._note_size()
            log.warning("Kafka is not taking messages: holding windows in the outage buffer (up to %.1f MiB)",
                        self.max_bytes / 2**20)
        elif empty and self._since:
            log.warning("outage buffer drained: Kafka took everything after %.1f s (peak %.2f MiB held; %d windows "
                        "dropped so far)", time.monotonic() - self._since, self.peak_bytes / 2**20,
                        self.dropped_windows)
            self._since = 0.0
        return empty

    def drop_rest(self) -> None:
        """At exit: count what is still held as dropped (what librdkafka holds is not: its fate is unknown)."""
        if self.held:
            self.max_bytes = -1  # an empty window pushes every held one out through the drop accounting
            self.add(HeldWindow([], [], 0))
            self.held.clear()
            self.held_bytes = 0

    @property
    def unconfirmed(self) -> int:
        """Messages handed to librdkafka without a delivery report yet."""
        return self._unacked
