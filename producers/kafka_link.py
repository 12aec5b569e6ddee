"""Whether the agent's Kafka is there: reachable, with every topic the agent writes, and how large a message each
topic takes.

A DaemonSet agent often starts before its cluster is reachable, and clusters go away; the agent keeps sampling
either way. A thread of its own asks the cluster for metadata (never the sampling loop: a metadata request to an
unreachable cluster takes seconds) at start, again with backoff while Kafka is away, and again when the outbox
suspects it (nothing acknowledged for `stall_s`). One log line per change of state: unreachable, topics missing,
back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from schemas.wire import DEFAULT_MAX_BYTES, MESSAGE_MAX_BYTES

log = logging.getLogger("fleetprof.agent")

READY, UNREACHABLE, TOPICS_MISSING, UNKNOWN = "ready", "unreachable", "topics missing", "unknown"
# Kafka's record batch framing and our key fit in this: a value this much under the limit is taken.
FRAMING_BYTES = 1024


def client_config(config: dict) -> dict:
    """The connection settings of a librdkafka config (address, TLS, SASL), for admin and metadata clients."""
    return {k: v for k, v in config.items() if k == "bootstrap.servers" or k.startswith(("security.", "sasl.", "ssl."))}


class KafkaLink:
    """The agent's view of its Kafka cluster; `ready` and `limits` are read by the sampling thread."""

    def __init__(self, config: dict, topics: list[str], check_timeout_s: float = 5.0, min_backoff_s: float = 1.0,
                 max_backoff_s: float = 10.0, stall_s: float = 5.0,
                 on_change: Callable[[str, str], None] | None = None) -> None:
        self.config = config
        self.topics = topics
        self.where = config.get("bootstrap.servers", "?")
        self.check_timeout_s = check_timeout_s
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.stall_s = stall_s
        self.on_change = on_change
        self.state = UNKNOWN
        self.reason = ""
        self.changes = 0  # state changes after the first
        producer_limit = int(config.get("message.max.bytes", MESSAGE_MAX_BYTES))
        self._producer_limit = producer_limit
        self.limits: dict[str, int] = {t: min(DEFAULT_MAX_BYTES, producer_limit - FRAMING_BYTES) for t in topics}
        self._checked_at = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self.state == READY

    def max_bytes(self, topic: str) -> int:
        """The largest value a message to `topic` may have, as far as is known."""
        return self.limits.get(topic, DEFAULT_MAX_BYTES)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetprof-kafka-link", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.check_timeout_s + 5)

    def suspect(self) -> None:
        """Look again now (the outbox saw no acknowledgement for a while)."""
        if self.state == READY and time.monotonic() - self._checked_at > self.stall_s:
            self._checked_at = time.monotonic()
            self._wake.set()

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.ready

    def _run(self) -> None:
        backoff = self.min_backoff_s
        while not self._stop.is_set():
            state, reason = self.check()
            self._set(state, reason)
            if state == READY:
                backoff = self.min_backoff_s
                self._wake.wait()  # until the outbox suspects trouble (or stop)
            else:
                self._wake.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
            self._wake.clear()

    def check(self) -> tuple[str, str]:
        """(state, reason) now: a metadata request, then the topics' message limits."""
        quiet = logging.getLogger("fleetprof.librdkafka.link")
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False  # connection-refused chatter is expected here; the state line says it
        errors: list[str] = []
        cfg = {**client_config(self.config), "logger": quiet, "error_cb": lambda e: errors.append(e.str())}
        probe = Producer(cfg)
        try:
            md = probe.list_topics(timeout=self.check_timeout_s)
        except KafkaException as exc:
            probe.poll(0)  # serve error callbacks: they say why (refused, name resolution, TLS, auth)
            return UNREACHABLE, errors[-1] if errors else exc.args[0].str()
        missing = [t for t in self.topics if t not in md.topics or md.topics[t].error is not None]
        if missing:
            return TOPICS_MISSING, ", ".join(missing)
        self._read_limits(cfg)
        return READY, ""

    def _read_limits(self, cfg: dict) -> None:
        """Each topic's max.message.bytes (the broker's message.max.bytes unless the topic sets its own)."""
        try:
            admin = AdminClient(cfg)
            futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in self.topics])
            for resource, future in futures.items():
                entry = future.result(timeout=self.check_timeout_s).get("max.message.bytes")
                if entry is not None and entry.value:
                    limit = min(int(entry.value), self._producer_limit) - FRAMING_BYTES
                    self.limits[resource.name] = min(DEFAULT_MAX_BYTES, limit)
        except (KafkaException, ValueError) as exc:  # keep what is known: it errs on the small side
            log.info("could not read the topics' message limits from Kafka at %s: %s", self.where, exc)

    def _set(self, state: str, reason: str) -> None:
        if (state, reason) == (self.state, self.reason):
            return
        first = self.state == UNKNOWN
        self.state, self.reason = state, reason
        if not first:
            self.changes += 1
        if state == UNREACHABLE:
            log.warning("Kafka at %s not reachable (%s): holding records in the outbox, retrying", self.where,
                        reason)
        elif state == TOPICS_MISSING:
            log.warning("Kafka at %s lacks topic(s) %s: holding records in the outbox, retrying (create them, e.g. "
                        "`fleetprof kafka up` for the local broker)", self.where, reason)
        elif not first:
            log.warning("Kafka at %s is back: sending what the outbox holds", self.where)
        if self.on_change is not None:
            self.on_change(state, reason)
