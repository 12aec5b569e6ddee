"""Everything the agent sends, on its way to Kafka: one bounded queue for every kind of record.

Units (a window's CPU batch, a drain's GPU launches or kernels, an NVML poll, the symbol tables some of them need)
leave in the order they were put. librdkafka is handed one step at a time — messages of symbol tables, or of record
units — never more than `inflight_bytes` (or one message) in flight, whatever the kind: a broker that is up but slow
must not let librdkafka hold more than the bound allows, since all of it counts once Kafka goes away. Records go only
once every table step before them is acknowledged, so a table is in Kafka before any record that needs it. Whatever
librdkafka holds is delivered once (idempotent, no expiry).

What waits here counts against `max_bytes` (while Kafka is away, what librdkafka holds counts too). Beyond it the oldest
whole record units are dropped, never those just put while Kafka takes messages, and while it is away never the newest
record unit (a large drain comes in several, see OutboxEncoder); symbol tables only when nothing else is left to drop,
and then with every held unit that needs them (the encoder is told, and sends those tables again when they are next
needed). Never a unit part of which librdkafka has: a table of several chunks (the kernel's: several MB) that Kafka went
away in the middle of stays, past the bound by its rest, since dropping it would only have it put again, whole, with the
next record that needs it. Nothing is handed over while the KafkaLink says Kafka is unreachable or lacks topics. Drops,
and messages Kafka refuses for good (too large, say), are counted per kind; none of them stops the agent. Kafka that
passes the link's checks but acknowledges nothing for `silent_warn_s` is said in a log line (records then wait, and the
oldest go, while Kafka looks up).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from producers.agent import Records
from producers.kafka_link import KafkaLink
from producers.outbox_encoder import OutboxEncoder
from producers.outbox_units import KINDS, Unit
from producers.publisher import Publisher, PublishError

log = logging.getLogger("fleetprof.agent")

RECORD_NAMES = {"symbols": "chunks", "cpu": "samples", "gpu_launches": "launches", "gpu_kernels": "kernels",
                "gpu_metrics": "polls", "dead_letters": "letters"}

DROPPED = Counter("fleetprof_agent_dropped_records_total", "Records dropped from the outbox while Kafka was away",
                  ["kind"])
DROPPED_BYTES = Counter("fleetprof_agent_dropped_bytes_total", "Message bytes dropped from the outbox", ["kind"])
UNSENDABLE = Counter("fleetprof_agent_unsendable_messages_total", "Messages Kafka refused for good", ["kind"])
PENDING_BYTES = Gauge("fleetprof_agent_outbox_bytes", "Message bytes waiting for Kafka (held and in flight)")


@dataclass
class Tally:
    units: int = 0
    messages: int = 0
    records: int = 0
    bytes: int = 0

    def add(self, unit: Unit) -> None:
        self.units += 1
        self.messages += len(unit.messages)
        self.records += unit.records
        self.bytes += unit.size


@dataclass
class _Step:
    """Messages handed to librdkafka together, done when each has its delivery report; `units` are those whose last
    message is among them (a large unit may span steps)."""

    symbols: bool
    units: list[Unit] = field(default_factory=list)
    size: int = 0
    unacked: int = 0


def _tallies() -> dict[str, Tally]:
    return {kind: Tally() for kind in KINDS}


class Outbox:
    """Ships Units through `publisher` in order while `link` says Kafka is ready, holding at most `max_bytes`."""

    def __init__(self, publisher: Publisher, link: KafkaLink, encoder: OutboxEncoder, max_bytes: int,
                 inflight_bytes: int = 16 << 20, silent_warn_s: float = 30.0) -> None:
        self.publisher = publisher
        self.link = link
        self.encoder = encoder
        self.max_bytes = max_bytes
        self.inflight_bytes = max(1, min(inflight_bytes, max_bytes // 2))
        self.held: deque[Unit] = deque()
        self.held_bytes = 0  # of messages not handed over yet
        self._head_sent = 0  # messages of held[0] already handed over: that unit is no longer droppable
        self._steps: list[_Step] = []  # with librdkafka now, in the order handed over
        self._inflight = 0  # their bytes
        self.put_tally, self.sent, self.dropped = _tallies(), _tallies(), _tallies()
        self.unsendable = {kind: 0 for kind in KINDS}  # messages Kafka refused for good
        self.peak_bytes = 0  # most bytes counted against the bound (_counted) from Kafka going away to the drain
        self._away_since = 0.0  # when Kafka stopped taking messages; 0 while it takes them
        self._last_ack = time.monotonic()
        self._drop_log_at = 0.0
        self.silent_warn_s = silent_warn_s  # Kafka reachable yet acknowledging nothing this long: say so
        self._silent_log_at = 0.0

    @property
    def pending_bytes(self) -> int:
        return self.held_bytes + self._inflight

    @property
    def unconfirmed(self) -> int:
        """Messages handed to librdkafka without a delivery report yet."""
        return sum(step.unacked for step in self._steps)

    @property
    def empty(self) -> bool:
        return not (self.held or self._steps)

    def put(self, records: Records) -> None:
        """Encode and queue collected records (the Outlet the agent puts into)."""
        self.add(self.encoder.units(records.kind, records.records))

    @property
    def pending(self) -> bool:
        return not self.empty

    def add(self, units: list[Unit]) -> None:
        """Queue units behind the others; drop the oldest held ones while over the bound (see the module)."""
        for unit in units:
            self.held.append(unit)
            self.held_bytes += unit.size
            self.put_tally[unit.kind].add(unit)
        self.pump()  # tables go at once: then a window larger than the bound passes while Kafka takes it
        newest = self._kept(units)
        dropped = _tallies()
        while self._over():
            started = id(self.held[0]) if self._head_sent else None
            victim = next((u for u in self.held if u.kind != "symbols" and id(u) not in newest
                           and id(u) != started), None)
            if victim is not None:
                self._drop([victim], dropped)
                continue
            tables = next((u for u in self.held if u.kind == "symbols" and id(u) not in newest
                           and id(u) != started), None)
            if tables is None:
                break  # only the newest units, or what librdkafka holds: never dropped here
            self._drop([tables, *(u for u in self.held if u.needs & tables.tables and id(u) != started)], dropped)
            self.encoder.forget(tables.tables)
        if any(t.units for t in dropped.values()):
            self._log_drops(dropped)
        self._track_away()
        self._note_size(after_put=True)

    def _kept(self, units: list[Unit]) -> set[int]:
        """Which of the units just put are never dropped by this put: while Kafka takes messages, all of them (a
        window larger than the bound still goes); while it is away, their tables and the last record unit only, so
        a large drain (cut into units by the encoder) leaves the outbox at its bound but for one unit."""
        if self.link.ready:
            return {id(u) for u in units}
        records = [u for u in units if u.kind != "symbols"]
        return {id(u) for u in units if u.kind == "symbols"} | {id(u) for u in records[-1:]}

    def _over(self) -> bool:
        return self._counted > self.max_bytes

    @property
    def _counted(self) -> int:
        """What counts against the bound: what waits here and what librdkafka holds while Kafka is away; while it
        takes messages, only what waits here (what is in flight is moving: a window with large new tables passes
        through)."""
        return self.held_bytes if self.link.ready else self.pending_bytes

    def _drop(self, units: list[Unit], into: dict[str, Tally]) -> None:
        for unit in units:
            if self._head_sent and unit is self.held[0]:  # at exit only: part of it is with librdkafka already
                self.held_bytes -= sum(len(m[2]) for m in unit.messages[self._head_sent:])
                self._head_sent = 0
            else:
                self.held_bytes -= unit.size
            self.held.remove(unit)
            self.dropped[unit.kind].add(unit)
            into[unit.kind].add(unit)
            DROPPED.labels(unit.kind).inc(unit.records)
            DROPPED_BYTES.labels(unit.kind).inc(unit.size)

    def _log_drops(self, now: dict[str, Tally], why: str = "") -> None:
        if not why and time.monotonic() - self._drop_log_at < 10.0:  # at most a line per 10 s, with the totals
            return
        self._drop_log_at = time.monotonic()
        what = ", ".join(f"{t.records} {RECORD_NAMES[k]}" for k, t in now.items() if t.units)
        total = ", ".join(f"{t.records} {RECORD_NAMES[k]}" for k, t in self.dropped.items() if t.units)
        why = why or f"outbox full ({self.max_bytes / 2**20:.1f} MiB, --buffer-mb): dropped the oldest records"
        log.warning("%s: %s; so far %s", why, what, total)

    def _note_size(self, after_put: bool = False) -> None:
        # only a put adds bytes; a pump moves or retires them. The bound's own measure: while Kafka takes the
        # backlog again, what it has in flight is moving, not held (it made the peak pass the bound by up to half)
        if after_put and self._away_since:
            self.peak_bytes = max(self.peak_bytes, self._counted)
        PENDING_BYTES.set(self.pending_bytes)

    def _acked(self, step: _Step, kind: str, delivered: bool, reason: str) -> None:
        step.unacked -= 1
        self._last_ack = time.monotonic()
        if not delivered:
            self._refused(kind, reason)

    def _refused(self, kind: str, reason: str) -> None:
        self.unsendable[kind] += 1
        UNSENDABLE.labels(kind).inc()
        log.error("a %s message was refused for good and is lost (%d so far): %s", kind, self.unsendable[kind], reason)

    def _may_hand_over(self) -> bool:
        """While Kafka is ready and what is in flight is under `inflight_bytes`: tables at once, records once every
        table before them is acknowledged."""
        if not self.held or not self.link.ready or not self._next_fits():
            return False
        return self.held[0].kind == "symbols" or not any(step.symbols for step in self._steps)

    def _next_fits(self) -> bool:
        """The next message stays within `inflight_bytes`, or nothing is in flight (one message always may go)."""
        size = len(self.held[0].messages[self._head_sent][2])
        return not self._inflight or self._inflight + size <= self.inflight_bytes

    def _hand_over(self) -> None:
        """Give librdkafka the next step: messages of the tables at the head, or of the record units there, while
        what is in flight stays under `inflight_bytes` (one message at least)."""
        symbols = self.held[0].kind == "symbols"
        step = _Step(symbols)
        if not self._steps:  # the stall clock runs from the oldest message without a report, not the newest
            self._last_ack = time.monotonic()
        self._steps.append(step)  # before publishing: a delivery report may come while the next one is queued
        while self.held and (self.held[0].kind == "symbols") == symbols:
            if step.size and not self._next_fits():
                break
            unit = self.held[0]
            topic, key, value, _ = unit.messages[self._head_sent]
            self._head_sent += 1
            step.size += len(value)
            self._inflight += len(value)
            self.held_bytes -= len(value)
            if self._head_sent == len(unit.messages):
                self.held.popleft()
                self._head_sent = 0
                step.units.append(unit)
            step.unacked += 1
            try:
                self.publisher.publish(topic, key, value,
                                       done=lambda ok, why, k=unit.kind: self._acked(step, k, ok, why))
            except PublishError as exc:  # refused before it left (larger than the producer allows, say)
                step.unacked -= 1
                self._refused(unit.kind, str(exc))

    def pump(self) -> bool:
        """Serve delivery reports; hand over what may go (see _may_hand_over). Never waits. True when it moved
        something along."""
        self.publisher.poll(0)
        moved = False
        for step in [s for s in self._steps if not s.unacked]:
            self._steps.remove(step)
            self._inflight -= step.size
            for unit in step.units:
                self.sent[unit.kind].add(unit)
            moved = True
        if self._steps and time.monotonic() - self._last_ack > self.link.stall_s:
            self.link.suspect()  # nothing acknowledged for a while: is Kafka still there?
            self._warn_silent()
        while self._may_hand_over():
            self._hand_over()
            moved = True
        self._track_away()
        self._note_size()
        return moved

    def _warn_silent(self) -> None:
        """One line per `silent_warn_s` while Kafka answers the link's checks but acknowledges none of what
        librdkafka holds: the records then wait (and the oldest are dropped) although Kafka looks up."""
        now = time.monotonic()
        silent = now - self._last_ack
        if not self.link.ready or silent < self.silent_warn_s or now - self._silent_log_at < self.silent_warn_s:
            return
        self._silent_log_at = now
        state = self.publisher.state_line()
        log.warning("Kafka at %s is reachable but has acknowledged nothing for %.0f s: %d messages (%.2f MiB) wait "
                    "in the producer, %.2f MiB in the outbox%s", self.link.where, silent, self.unconfirmed,
                    self._inflight / 2**20, self.held_bytes / 2**20, f"; {state}" if state else "")

    def _track_away(self) -> None:
        waiting = not self.empty
        if waiting and not self.link.ready and not self._away_since:
            self._away_since = time.monotonic()
        elif not waiting and self._away_since:
            log.warning("outbox drained: Kafka took everything held after %.1f s (peak %.2f MiB held)",
                        time.monotonic() - self._away_since, self.peak_bytes / 2**20)
            self._away_since = 0.0

    def drain(self, budget_s: float) -> bool:
        """Pump until everything is acknowledged or `budget_s` is spent; True when all is delivered."""
        deadline = time.monotonic() + budget_s
        while not self.empty and time.monotonic() < deadline:
            if not self.pump():
                self.publisher.poll(0.02)
        return self.empty

    def drop_held(self) -> None:
        """At exit: count what is still held as dropped (what librdkafka holds is not: its fate is unknown)."""
        dropped = _tallies()
        self._drop(list(self.held), dropped)
        if any(t.units for t in dropped.values()):
            self._log_drops(dropped, "stopping while Kafka is away: dropped what the outbox held")
