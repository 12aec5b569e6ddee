"""The node's one Kafka producer: idempotent, acks=all, lz4, a bounded local queue, nothing dropped silently.

Used by the agent's outbox and by loadgen. Back-pressure (a full local queue) blocks the caller while delivery
reports drain the queue; a message that fails for good is counted and `flush` raises with the first reason.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Message, Producer

log = logging.getLogger("fleetprof.publisher")

PRODUCER_DEFAULTS: dict[str, object] = {
    "enable.idempotence": True,  # implies acks=all and bounded in-flight requests: no duplicates, no reordering
    "acks": "all",
    "linger.ms": 20,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 64 * 1024,  # the bounded local queue: 64 MiB
    # never expire a queued message: during a Kafka outage the caller decides what to keep and what to drop
    # (producers/outbox.py); a message librdkafka holds is delivered once, whenever the broker is back
    "message.timeout.ms": 0,
    "log_level": 3,  # librdkafka errors only: retried warnings (coordinator loading, reconnects) are noise here
}
STATS_INTERVAL_MS = 30_000  # the producer's view of its brokers this often, to say why nothing is acknowledged


class PublishError(RuntimeError):
    """Messages could not be delivered; str(err) is one line."""


class Publisher:
    """One idempotent producer with delivery accounting: `sent`, `delivered`, `failed`, `bytes` (values queued)."""

    def __init__(self, config: dict, block_timeout: float = 60.0) -> None:
        cfg = {**PRODUCER_DEFAULTS, **config}
        cfg.setdefault("error_cb", self._on_error)
        cfg.setdefault("stats_cb", self._on_stats)
        cfg.setdefault("statistics.interval.ms", STATS_INTERVAL_MS)
        cfg.setdefault("logger", logging.getLogger("fleetprof.librdkafka"))
        self._producer = Producer(cfg)
        self.block_timeout = block_timeout
        self.sent = self.delivered = self.failed = self.bytes = 0
        self.blocked_s = 0.0  # time spent waiting for room in the local queue
        self.first_error = ""
        self.broker_error = ""
        self.brokers = ""  # librdkafka's last statistics, one line: each broker's state and what waits on it

    def _on_delivery(self, err: KafkaError | None, msg: Message,
                     done: Callable[[bool, str], None] | None = None) -> None:
        reason = "" if err is None else f"{msg.topic()}: {err.str()}"
        if done is not None:
            done(err is None, reason)
        if err is None:
            self.delivered += 1
            return
        self.failed += 1
        if not self.first_error:
            self.first_error = reason

    def _on_error(self, err: KafkaError) -> None:
        # Transient broker errors (a broker restarting) are retried by librdkafka; fatal ones end every send.
        self.broker_error = err.str()
        if err.fatal():
            self.first_error = self.first_error or f"fatal producer error: {err.str()}"
        log.debug("kafka producer error: %s", err.str())

    def _on_stats(self, stats_json: str) -> None:
        try:
            stats = json.loads(stats_json)
            self.brokers = ", ".join(
                f"{b.get('nodename') or name} {b.get('state')} (requests waiting to go {b.get('outbuf_cnt', 0)}, "
                f"awaiting a response {b.get('waitresp_cnt', 0)}, timed out {b.get('req_timeouts', 0)}, "
                f"connects {b.get('connects', 0)})"
                for name, b in stats.get("brokers", {}).items())
        except (ValueError, AttributeError, TypeError):  # a shape this code does not know: say nothing of it
            self.brokers = ""

    def state_line(self) -> str:
        """What the producer last said of its brokers, and its last broker error; '' when it said nothing."""
        parts = [f"brokers: {self.brokers}" if self.brokers else "",
                 f"last broker error: {self.broker_error}" if self.broker_error else ""]
        return "; ".join(p for p in parts if p)

    def publish(self, topic: str, key: bytes | str, value: bytes,
                done: Callable[[bool, str], None] | None = None) -> None:
        """Queue one message, waiting (never dropping) while the local queue is full; `done(delivered, reason)` is
        called from a later poll or flush once its fate is known."""
        deadline = None
        report = self._on_delivery if done is None else lambda err, msg: self._on_delivery(err, msg, done)
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=report)
                break
            except BufferError:
                now = time.monotonic()
                deadline = deadline or now + self.block_timeout
                if now > deadline:
                    why = f" (last broker error: {self.broker_error})" if self.broker_error else ""
                    raise PublishError(f"local Kafka queue still full after {self.block_timeout:.0f} s{why}") from None
                self._producer.poll(0.05)  # serve delivery reports: that is what frees the queue
                self.blocked_s += time.monotonic() - now
            except KafkaException as exc:
                raise PublishError(f"cannot queue a message for {topic}: {exc.args[0].str()}") from None
        self.sent += 1
        self.bytes += len(value)
        if self.sent % 64 == 0:  # serve delivery reports now and then; on every message it costs more than produce
            self._producer.poll(0)

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports."""
        self._producer.poll(timeout)

    def flush(self, timeout: float = 60.0) -> int:
        """Wait for delivery; returns how many are still undelivered. Raises PublishError if any failed for good."""
        remaining = self._producer.flush(timeout)
        if self.failed:
            raise PublishError(f"{self.failed} of {self.sent} messages failed; first: {self.first_error}")
        return remaining

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self._producer.flush(5.0)


def check_broker(config: dict, topics: list[str], timeout: float = 8.0) -> None:
    """Raise PublishError (one line) unless the cluster answers within `timeout` and has every topic."""
    cfg = {k: v for k, v in config.items() if k == "bootstrap.servers" or k.startswith(("security.", "sasl.", "ssl."))}
    quiet = logging.getLogger("fleetprof.librdkafka.check")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False  # connection-refused chatter is expected here; the one-line error says it all
    errors: list[str] = []
    probe = Producer({**cfg, "logger": quiet, "error_cb": lambda e: errors.append(e.str())})
    where = config.get("bootstrap.servers", "?")
    try:
        md = probe.list_topics(timeout=timeout)
    except KafkaException as exc:
        probe.poll(0)  # serve error callbacks: they say why (connection refused, name resolution, TLS, auth)
        last = f": {errors[-1]}" if errors else f": {exc.args[0].str()}"
        raise PublishError(f"Kafka at {where} not reachable within {timeout:.0f} s{last}") from None
    missing = [t for t in topics if t not in md.topics or md.topics[t].error is not None]
    if missing:
        raise PublishError(f"Kafka at {where} lacks topic(s) {', '.join(missing)}; "
                           "create them first (e.g. `fleetprof kafka up` for the local broker)")
