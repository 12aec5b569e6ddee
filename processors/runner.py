"""The runner: the only place processors touch Kafka. Consumer group, batch poll, decode, call the stage's pure
function, produce in a Kafka transaction together with the consumed offsets, dead-letter what cannot be processed,
stop cleanly on SIGTERM.

Topic-to-topic stages are exactly-once through Kafka transactions (KIP-447: offsets committed in the same
transaction as the output). Topic-to-ClickHouse stages use processors/store_writer.py.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors import metrics
from processors.gc_policy import batch_in_hand, tune_collector
from processors.messages import Message, Produced, dead_letter, decode_message
from schemas import single_object, topics
from schemas.wire import MESSAGE_MAX_BYTES

log = logging.getLogger("fleetprof.runner")
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_OUTPUT_BYTES = MESSAGE_MAX_BYTES  # stages split their outputs below it
T = TypeVar("T")
CALL_TIMEOUT_S = 10.0  # what one transactional call waits; one that times out is made again (retriable)
RETRY_FIRST_DELAY, RETRY_MAX_DELAY = 0.2, 5.0  # seconds between tries of a call the broker did not answer
# A transactional call still blocked this long past its own timeout is stuck in librdkafka (send_offsets_to_transaction
# can wait forever for a group coordinator it cached across a broker restart: librdkafka issues 5456 and 5511).
STUCK_GRACE_S = 10.0
GATHER_QUIET_S = 0.2  # a poll this long that brings nothing ends a gathered batch (TopicRunner gather_s)
EXIT_STUCK = 75  # the process's exit status then (EX_TEMPFAIL): its supervisor starts a new one, which fences it


class TopicStage:
    """A topic-to-topic stage: `process` is pure over decoded records; the hooks, which do nothing unless a stage
    overrides them, are where it fetches side inputs (symbol tables, its state) and learns the fate of its output.
    A stage with `columnar_input = True` gets CPU stack batches with each process's stacks as a PackedStacks
    (schemas/packed_stacks.py) instead of a list of dicts."""

    name: str
    inputs: tuple[str, ...]
    columnar_input: bool = False

    def process(self, messages: list[Message]) -> list[Produced]:
        raise NotImplementedError(f"{type(self).__name__} has no process()")

    def decode_batch(self, raws: list, expect: dict[str, str], max_bytes: int) -> list[Message | Produced]:
        """Each consumed message decoded, or the dead letter saying why it is not; in order. A stage may decode a
        batch at once (processors/correlate_decode.py) as long as it returns what `decode_message` would."""
        return [decode_message(self.name, raw, expect, max_bytes, self.columnar_input) for raw in raws]

    def before_batch(self, messages: list[Message]) -> None:
        """Called with each batch's decoded messages before `process`."""

    def idle(self) -> None:
        """Called when a poll brought nothing: room for work that would otherwise wait on the next batch's path
        (reading side inputs published ahead of the records that need them)."""

    def after_commit(self) -> None:
        """The output of the `process` calls since the last commit or abort is committed."""

    def after_abort(self) -> None:
        """That output was aborted (or `process` failed on the batch): it never happened."""

    def close(self) -> None:
        """The runner stops: release what the stage holds."""


CONSUMER_ONLY = ("session.timeout.ms",)  # settings a producer would warn about (CONFWARN) and ignore


def client_config(kafka: dict, **extra: object) -> dict:
    """librdkafka settings with its log lines routed into Python logging (structured, to the process's log)."""
    cfg = {k: v for k, v in kafka.items() if k not in CONSUMER_ONLY}
    cfg["logger"] = logging.getLogger("fleetprof.rdkafka")
    cfg.update(extra)
    return cfg


def consumer_config(kafka: dict, group: str, **extra: str) -> dict:
    cfg = client_config(kafka)
    cfg.update({k: kafka[k] for k in CONSUMER_ONLY if k in kafka})
    cfg.update({
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": False,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
    })
    cfg.update(extra)
    return cfg


def count_messages_in(stage: str, raws: list) -> None:
    """MESSAGES_IN for a batch: one increment per topic (a labelled increment per message was ~4% of the
    correlator's CPU in a 1,000-node fleet run, py-spy)."""
    for topic, n in Counter(raw.topic() for raw in raws).items():
        metrics.MESSAGES_IN.labels(stage, topic).inc(n)


def instance_id(stage: str, slot: int | None = None) -> str:
    """Transactional id: stable per instance slot, so a restarted instance fences and aborts the transaction its
    predecessor left open instead of leaving read_committed consumers waiting for it to time out."""
    if slot is None:
        slot = int(os.environ.get("FLEETPROF_INSTANCE", "0"))
    return f"fleetprof-{stage}-{socket.gethostname()}-{slot}"


def install_sigterm(stop: threading.Event) -> None:
    """SIGTERM and SIGINT finish the batch in hand, commit, leave the group and return."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())


def expected_schemas(inputs: Iterable[str]) -> dict[str, str]:
    return {t: topics.BY_NAME[t].schema for t in inputs if t in topics.BY_NAME}


def encode_produced(p: Produced) -> tuple[bytes | None, bytes]:
    key = p.key.encode() if isinstance(p.key, str) else p.key
    return key, single_object.encode(p.schema, p.record)


class TopicRunner:
    """Runs one topic-to-topic stage in a consumer group, exactly once per input message."""

    def __init__(self, stage: TopicStage, kafka: dict, *, batch_size: int = 200, poll_timeout: float = 0.5,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, group: str | None = None,
                 txn_timeout: float = 30.0, slot: int | None = None, gather_s: float = 0.0,
                 gather_quiet_s: float = GATHER_QUIET_S) -> None:
        """gather_s: once a poll brings messages, keep polling while messages keep coming (a poll of gather_quiet_s
        that brings none ends it), for at most gather_s and batch_size messages: a burst becomes one batch (0: one
        poll per batch)."""
        self.stage = stage
        self.batch_size = batch_size
        self.poll_timeout = poll_timeout
        self.gather_s, self.gather_quiet_s = gather_s, gather_quiet_s
        self.max_message_bytes = max_message_bytes
        self.txn_timeout = txn_timeout
        self.call_timeout = min(txn_timeout, CALL_TIMEOUT_S)
        self.expect = expected_schemas(stage.inputs)
        self.columnar = stage.columnar_input
        group = group or f"fleetprof-{stage.name}"
        kept = getattr(stage, "group", None)  # a stateful stage keys its changelog by the group it runs in
        if kept is not None and kept != group:
            raise ValueError(f"the {stage.name} stage keeps its state under group {kept!r} but would run in group "
                             f"{group!r}: two groups' states would mix")
        self.consumer = Consumer(consumer_config(kafka, group))
        pcfg = client_config(kafka)
        pcfg.update({"transactional.id": instance_id(stage.name, slot), "enable.idempotence": True,
                     "transaction.timeout.ms": 15000,
                     "linger.ms": 20, "compression.type": "lz4"})
        self.producer = Producer(pcfg)
        self.batches = 0
        self._stop = threading.Event()  # run()'s: bounds the retries of a call the broker does not answer
        self._watched: tuple[str, float] | None = None  # the transactional call in progress, and when it is stuck

    def start(self) -> None:
        tune_collector()
        self.producer.init_transactions(self.txn_timeout)
        self.consumer.subscribe(list(self.stage.inputs))

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        if threading.current_thread() is threading.main_thread():  # the process is this runner's own: see _stuck
            threading.Thread(target=self._watchdog, name="txn-watchdog", daemon=True).start()
        self.start()
        try:
            while not stop.is_set():
                self.run_once()
        finally:
            self.close()

    def run_once(self) -> int:
        """Poll one batch and make it durable; returns the number of messages consumed."""
        with batch_in_hand():  # the batch's objects are gone when _run_batch returns, before collections resume
            return self._run_batch()

    def _run_batch(self) -> int:
        raws = self._gather(self.consumer.consume(num_messages=self.batch_size, timeout=self.poll_timeout))
        raws = [m for m in raws if not skip_consumer_error(m)]
        if not raws:
            self.stage.idle()
            return 0
        started = time.monotonic()
        decoded: list[Message] = []
        out: list[Produced] = []
        count_messages_in(self.stage.name, raws)
        for raw, item in zip(raws, self.stage.decode_batch(raws, self.expect, self.max_message_bytes), strict=True):
            if isinstance(item, Message):
                decoded.append(item)
            else:
                log.warning("dead letter: %s[%d]@%d: %s", raw.topic(), raw.partition(), raw.offset(),
                            item.record["reason"])
                out.append(item)
        if decoded:
            self.stage.before_batch(decoded)
            out.extend(self._process(decoded))
        self._commit(out)
        metrics.BATCH_SECONDS.labels(self.stage.name).observe(time.monotonic() - started)
        return len(raws)

    def _gather(self, raws: list) -> list:
        """`raws` and what follows it without a pause (see gather_s). A poll returns after its timeout unless the
        batch is full, so without this a burst (every node's window at its end: 32,000 launches and kernels per 100
        nodes) is cut into one batch per poll, each a transaction with its own changelog records and output
        records per node, and a trailing small one the sink writes on its own."""
        if not raws or self.gather_s <= 0:
            return raws
        until = time.monotonic() + self.gather_s
        while len(raws) < self.batch_size and time.monotonic() < until:
            more = self.consumer.consume(num_messages=self.batch_size - len(raws), timeout=self.gather_quiet_s)
            if not more:
                break
            raws += more
        return raws

    def _process(self, decoded: list[Message]) -> list[Produced]:
        try:
            return self.stage.process(decoded)
        except Exception:  # isolate the message that breaks the stage; the rest still goes through
            log.exception("stage %s failed on a batch of %d; retrying one by one", self.stage.name, len(decoded))
            self.stage.after_abort()  # forget what the failed attempt half-did
        out: list[Produced] = []
        for m in decoded:
            try:
                out.extend(self.stage.process([m]))
            except Exception as exc:
                out.append(dead_letter(self.stage.name, m.topic, m.partition, m.offset, m.key,
                                       m.value, f"processing failed: {exc!r}"))
        return out

    def _commit(self, out: list[Produced]) -> None:
        """Produce `out` and the consumed offsets in one transaction (KIP-447). A retriable error (the broker away,
        a timeout: the call goes on in the background) retries the same call; an abortable one aborts and re-reads
        the batch; a fatal one (this producer fenced by a newer instance, or broken) raises: the process exits
        non-zero, its supervisor starts it again, and the new instance fences whatever this one left open."""
        try:
            self.producer.begin_transaction()
            for p in out:
                key, value = encode_produced(p)
                if len(value) > MAX_OUTPUT_BYTES:
                    p = self._oversize(p, len(value))
                    key, value = encode_produced(p)
                self._produce(p.topic, key, value)
                counter = metrics.DEAD_LETTERS if p.topic == "deadletter" else metrics.RECORDS_OUT
                counter.labels(self.stage.name, p.topic).inc()
            positions = [tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0]
            group = self.consumer.consumer_group_metadata()
            self._txn_call("send_offsets_to_transaction",
                           lambda: self.producer.send_offsets_to_transaction(positions, group, self.call_timeout))
            self._txn_call("commit_transaction", lambda: self.producer.commit_transaction(self.call_timeout))
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or not err.txn_requires_abort():
                log.error("transaction failed for good (%s); exiting for a new instance to take over", err)
                raise
            log.warning("transaction aborted (%s); re-reading the batch", err)
            self._txn_call("abort_transaction", lambda: self.producer.abort_transaction(self.call_timeout))
            self.stage.after_abort()
            metrics.ABORTS.labels(self.stage.name).inc()
            self._rewind()
            return
        self.stage.after_commit()
        self.batches += 1
        metrics.COMMITS.labels(self.stage.name).inc()

    def _txn_call(self, what: str, call: Callable[[], None]) -> None:
        """A transactional call, made again while it fails with a retriable error (librdkafka's documented way:
        the same call picks up where the last left off)."""
        self._retry(what, call, lambda err: err.retriable() and not err.fatal() and not err.txn_requires_abort())

    def _retry(self, what: str, call: Callable[[], T], again: Callable[[KafkaError], bool]) -> T:
        """`call()`, made again while its KafkaError is one `again` accepts. Once asked to stop, given up after
        txn_timeout: the process exits non-zero and the next instance with this transactional id fences what this
        one left open."""
        delay, give_up = RETRY_FIRST_DELAY, float("inf")
        while True:
            try:
                return self._unless_stuck(what, call)
            except KafkaException as exc:
                err = exc.args[0]
                if self._stop.is_set():
                    give_up = min(give_up, time.monotonic() + self.txn_timeout)
                if not again(err) or time.monotonic() > give_up:
                    raise
                log.warning("%s failed (%s); retrying in %.1f s", what, err, delay)
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_DELAY)

    def _unless_stuck(self, what: str, call: Callable[[], T]) -> T:
        """`call()` (its own timeout is call_timeout), watched by _watchdog."""
        self._watched = (what, time.monotonic() + self.call_timeout + STUCK_GRACE_S)
        try:
            return call()
        finally:
            self._watched = None

    def _watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            watched = self._watched
            if watched is not None and time.monotonic() > watched[1]:
                self._stuck(watched[0])

    def _stuck(self, what: str) -> None:
        """A call blocked STUCK_GRACE_S past its own timeout: nothing in this process can unblock it, so the process
        exits with EXIT_STUCK; its supervisor starts a new one, which fences the transaction left open."""
        log.error("%s has not returned %.0f s after its %.0f s timeout: stuck in librdkafka; exiting for a new "
                  "instance to take over", what, STUCK_GRACE_S, self.call_timeout)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_STUCK)

    def _oversize(self, p: Produced, size: int) -> Produced:
        """The dead letter that replaces an output too large to send: for its input when it has one, else one that
        names the output (Kafka would refuse it, and raising here would stop the stage on every retry)."""
        reason = f"output of {size} bytes exceeds the {MAX_OUTPUT_BYTES}-byte message limit"
        src = p.source
        if src is not None:
            return dead_letter(self.stage.name, src.topic, src.partition, src.offset, src.key, src.value, reason)
        log.error("dropping a %d-byte output to %s: over the %d-byte message limit", size, p.topic, MAX_OUTPUT_BYTES)
        key = p.key.encode() if isinstance(p.key, str) else p.key
        return dead_letter(self.stage.name, p.topic, -1, -1, key, None, f"{reason}; dropped (an output, not an input)")

    def _produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key)
                return
            except BufferError:
                self.producer.poll(0.1)

    def _rewind(self) -> None:
        """Seek every assigned partition back to its committed offset after an abort (asked again while the group
        coordinator cannot answer: reading on from the position would skip the aborted batch)."""
        committed = self._retry("reading committed offsets",
                                lambda: self.consumer.committed(self.consumer.assignment(), timeout=self.call_timeout),
                                lambda err: not err.fatal())
        for tp in committed:
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0
                                              else OFFSET_BEGINNING))

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)
            self.stage.close()


def skip_consumer_error(raw) -> bool:
    err = raw.error()
    if err is None:
        return False
    if err.code() in (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART):
        return True
    log.warning("consumer error: %s", err)
    return True
