"""Alert webhook: every committed alert on the `alerts` topic as a JSON POST, at least once, in order.

A consumer of its own group reads the topic (read_committed: only alerts whose transaction committed), POSTs each
alert and commits its offset after a 2xx answer. A failed POST (refused, timeout, non-2xx) is retried with backoff
until it goes through, so an alert is never skipped; a crash between a POST and its commit sends that alert again,
which receivers can recognise by the Idempotency-Key header (alert id and state). The URL may hold a token, so it
never appears in logs beyond its scheme and host.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
from confluent_kafka import Consumer, Producer

from processors import metrics
from processors.messages import Message, decode_message
from processors.runner import (
    DEFAULT_MAX_MESSAGE_BYTES,
    client_config,
    consumer_config,
    encode_produced,
    skip_consumer_error,
)
from schemas import topics

log = logging.getLogger("fleetprof.webhook")
DEFAULT_GROUP = "fleetprof-alert-webhook"


def payload(alert: dict) -> dict:
    """The JSON body: the alert record, times also as UTC ISO-8601."""
    def iso(ns: int) -> str:
        return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat()

    return {**alert, "started": iso(alert["started_ns"]), "time": iso(alert["time_ns"]), "source": "fleetprof"}


def redacted(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}/…"


def check_url(url: str) -> str:
    """The URL if it is http(s) with a host; ValueError with a one-line reason otherwise (never echoing it)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the alert webhook URL must be http:// or https:// with a host")
    return url.strip()


class AlertWebhook:
    """Delivers the alerts topic to one webhook URL."""

    def __init__(self, kafka: dict, url: str, *, group: str = DEFAULT_GROUP, timeout: float = 10.0,
                 max_backoff: float = 30.0, poll_timeout: float = 0.2) -> None:
        self.url = check_url(url)
        self.where = redacted(self.url)
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.poll_timeout = poll_timeout
        self.consumer = Consumer(consumer_config(kafka, group))
        self.producer = Producer(client_config(kafka, **{"enable.idempotence": True, "acks": "all"}))
        self.http = httpx.Client(timeout=timeout, headers={"User-Agent": "fleetprof-alerts"})
        self.expect = {topics.ALERTS.name: topics.ALERTS.schema}
        self.delivered = 0

    def run(self, stop: threading.Event) -> None:
        self.consumer.subscribe([topics.ALERTS.name])
        log.info("delivering alerts to %s", self.where)
        try:
            while not stop.is_set():
                raw = self.consumer.poll(self.poll_timeout)
                if raw is None or skip_consumer_error(raw):
                    continue
                item = decode_message("alert-webhook", raw, self.expect, DEFAULT_MAX_MESSAGE_BYTES)
                if isinstance(item, Message):
                    if not self._post(item.record, stop):
                        return  # stopping: the offset stays uncommitted, the alert goes out after the restart
                else:  # not an alert we can read: to the dead-letter topic with the reason, then move on
                    log.warning("dead letter: alerts[%d]@%d: %s", raw.partition(), raw.offset(), item.record["reason"])
                    key, value = encode_produced(item)
                    self.producer.produce(item.topic, value=value, key=key)
                    self.producer.flush(30)
                self.consumer.commit(message=raw, asynchronous=False)
        finally:
            self.close()

    def _post(self, alert: dict, stop: threading.Event) -> bool:
        """POST until a 2xx answer; False if asked to stop first."""
        body = json.dumps(payload(alert), ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json",
                   "Idempotency-Key": f"{alert['alert_id']}/{alert['state']}"}
        backoff = 0.5
        while True:
            try:
                response = self.http.post(self.url, content=body, headers=headers)
                if 200 <= response.status_code < 300:
                    metrics.WEBHOOK_POSTS.labels("delivered").inc()
                    self.delivered += 1
                    return True
                reason = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                reason = type(exc).__name__
            metrics.WEBHOOK_POSTS.labels("retried").inc()
            log.warning("alert %s %s not delivered to %s (%s); retrying in %.1f s", alert["alert_id"],
                        alert["state"], self.where, reason, backoff)
            if stop.wait(backoff):
                return False
            backoff = min(backoff * 2, self.max_backoff)

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)
            self.http.close()


def webhook_thread(webhook: AlertWebhook, stop: threading.Event) -> threading.Thread:
    """Run `webhook` in a daemon thread until `stop`."""
    thread = threading.Thread(target=webhook.run, args=(stop,), name="alert-webhook", daemon=True)
    thread.start()
    return thread
