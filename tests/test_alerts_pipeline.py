"""The alerts stage on the real parts: gpu.metrics on a real broker → alerts topic (exactly once, through restarts
and a crash inside the transaction) → the store's alerts table (sink) and a real local HTTP webhook; evidence from
known CPU samples in a real chDB store."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from processors.alert_evidence import AlertEvidence
from processors.alert_webhook import AlertWebhook, webhook_thread
from processors.alerts import SECOND_NS, AlertConfig, alert_id
from processors.alerts_stage import build_alerts
from processors.runner import TopicRunner
from processors.sink import STACK_COLUMNS
from schemas import single_object
from tests.pipeline_helpers import Running, produce, read_topic, sink, wait_for

FRAME_COLUMNS = ["frame_id", "function", "binary", "kind", "last_seen"]  # build_id left to its default

CONFIG = AlertConfig(below=20, busy_above=50, hold_ns=30 * SECOND_NS, recover_above=40, recover_ns=15 * SECOND_NS)
SERIES = [90] * 10 + [5] * 40 + [80] * 20  # low from 10 s to 49 s: fires at 40 s, resolves at 65 s
GPU_PID, OTHER_PID = 4242, 999


class Crash(BaseException):
    """Stands for the process dying at that exact point."""


class Webhook:
    """A real HTTP server on 127.0.0.1 that records POSTs; the first `fail_first` answer 503."""

    def __init__(self, fail_first: int = 0) -> None:
        self.posts: list[tuple[dict, dict]] = []
        self.failed = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.failed < fail_first:
                    outer.failed += 1
                    self.send_response(503)
                else:
                    outer.posts.append((dict(self.headers), json.loads(body)))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/fleetprof?token=secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def for_node(self, node: str) -> list[tuple[dict, dict]]:
        return [(h, p) for h, p in self.posts if p["node"] == node]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _base() -> int:
    # whole seconds ten minutes ago: inside the tables' TTL, before `now` for the queries
    return (int(time.time()) - 600) * SECOND_NS


def _metrics(node: str, base: int, seconds: range) -> list[tuple[str, str, bytes]]:
    out = []
    for t in seconds:
        rec = {"node": node, "time_ns": base + t * SECOND_NS, "simulated": False,
               "devices": [{"index": 0, "uuid": f"GPU-{node}", "name": "H200", "gpu_util_pct": SERIES[t]}],
               "processes": [{"device_index": 0, "pid": GPU_PID, "comm": "train"}]}
        out.append(("gpu.metrics", node, single_object.encode("GpuMetrics", rec)))
    return out


def _cpu_rows(store, node: str, base: int) -> None:
    """Known CPU samples: pid GPU_PID in 10 s windows from 10 s to 40 s, another pid that must not count."""
    ts = [datetime.fromtimestamp(base / 1e9 + s, tz=UTC) for s in (-20, 10, 20, 30, 40)]
    store.insert("frames", [[1, "main", "train", "NATIVE", ts[0]], [2, "load_batch", "train", "NATIVE", ts[0]],
                            [3, "decode_jpeg", "libjpeg.so", "NATIVE", ts[0]], [4, "futex_wait", "libc.so.6",
                                                                                  "NATIVE", ts[0]]], FRAME_COLUMNS)
    store.insert("stacks", [[11, [1, 2, 3], ts[0]], [12, [1, 4], ts[0]]], STACK_COLUMNS)
    rows = [[ts[0], node, GPU_PID, "train", "", 12, 50]]  # before the drop's first window: not evidence
    for w in ts[1:4]:
        rows += [[w, node, GPU_PID, "train", "", 11, 10], [w, node, GPU_PID, "train", "", 12, 5],
                 [w, node, OTHER_PID, "other", "", 11, 100]]
    rows.append([ts[4], node, GPU_PID, "train", "", 11, 10])  # only in the resolved alert's range
    store.insert("cpu_samples", rows, ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])


def _alerts_runner(bootstrap: str, group: str, store, cls=TopicRunner) -> Running:
    kafka = {"bootstrap.servers": bootstrap}

    def query(name, params):
        return store.query_named(name, params)

    stage = build_alerts(kafka, CONFIG, AlertEvidence(query), group=group)
    return Running(cls(stage, kafka, group=group, poll_timeout=0.2, batch_size=20), threading.Event())


def _committed_alerts(bootstrap: str, node: str, want: int, timeout: float = 8) -> list[dict]:
    found = read_topic(bootstrap, "alerts", lambda m: m.key() == f"{node}/GPU-{node}".encode(), want + 1, timeout)
    return [single_object.decode(m.value(), expect="Alert")[1] for m in found]


def test_a_drop_alerts_with_evidence_to_the_topic_the_store_and_the_webhook_then_resolves(kafka_bootstrap, store):
    run = uuid.uuid4().hex[:8]
    node, base = f"alert-{run}", _base()
    _cpu_rows(store, node, base)
    produce(kafka_bootstrap, _metrics(node, base, range(len(SERIES))))
    hook = Webhook(fail_first=1)  # the first POST fails: it is retried, not lost
    stop = threading.Event()
    webhook = AlertWebhook({"bootstrap.servers": kafka_bootstrap}, hook.url, group=f"hook-{run}")
    webhook_thread(webhook, stop)
    try:
        with _alerts_runner(kafka_bootstrap, f"alerts-{run}", store) as alerter, \
                sink(store, kafka_bootstrap, f"sink-{run}") as snk:
            wait_for(lambda: len(hook.for_node(node)) == 2, timeout=60, what="two webhook POSTs",
                     running=[alerter, snk])
            wait_for(lambda: len(store.query_named("alerts", {"since": "1h", "node": node})[1]) == 2, timeout=30,
                     what="two alert rows", running=[alerter, snk])
    finally:
        stop.set()
        hook.close()
    aid = alert_id(node, f"GPU-{node}", base + 10 * SECOND_NS)
    firing_evidence = [{"pid": GPU_PID, "comm": "train", "folded_stack": "main;load_batch;decode_jpeg", "count": 30},
                       {"pid": GPU_PID, "comm": "train", "folded_stack": "main;futex_wait", "count": 15}]
    resolved_evidence = [dict(firing_evidence[0], count=40), firing_evidence[1]]

    posted = hook.for_node(node)
    assert [p["state"] for _, p in posted] == ["FIRING", "RESOLVED"]
    assert hook.failed == 1
    headers, firing = posted[0]
    assert headers["Idempotency-Key"] == f"{aid}/FIRING" and headers["Content-Type"] == "application/json"
    assert firing["alert_id"] == aid and firing["kind"] == "gpu_utilization_drop" and firing["gpu_index"] == 0
    assert firing["started_ns"] == base + 10 * SECOND_NS and firing["time_ns"] == base + 40 * SECOND_NS
    assert firing["started"] == datetime.fromtimestamp(base / 1e9 + 10, tz=UTC).isoformat()
    assert firing["threshold"] == 20 and firing["observed"] == 5.0
    assert firing["evidence"] == firing_evidence
    assert firing["message"] == f"GPU 0 (H200) on {node}: utilization 5% below 20% for 30 s (was at least 50%)"
    resolved = posted[1][1]
    assert resolved["alert_id"] == aid and resolved["time_ns"] == base + 65 * SECOND_NS
    assert resolved["evidence"] == resolved_evidence

    _, rows = store.query_named("alerts", {"since": "1h", "node": node})
    by_state = {r[1]: r for r in rows}
    assert set(by_state) == {"FIRING", "RESOLVED"}
    assert json.loads(by_state["FIRING"][11]) == firing_evidence
    assert by_state["RESOLVED"][7] == datetime.fromtimestamp(base / 1e9 + 65, tz=UTC)
    assert len(_committed_alerts(kafka_bootstrap, node, 2)) == 2


class DiesCommittingAnAlert(TopicRunner):
    """Produces a batch that holds an alert inside the transaction, then dies before committing it."""

    def _commit(self, out):
        if not any(p.topic == "alerts" for p in out):
            return super()._commit(out)
        self.producer.begin_transaction()
        for p in out:
            key = p.key.encode() if isinstance(p.key, str) else p.key
            self.producer.produce(p.topic, key=key, value=single_object.encode(p.schema, p.record))
        self.producer.flush(10)
        raise Crash()


def _gpu_state(running: Running, node: str) -> str | None:
    for detector in running.runner.stage.detectors.values():
        gpu = detector.gpus.get((node, f"GPU-{node}"))
        if gpu is not None:
            return gpu.phase
    return None


def test_restarts_and_a_crash_inside_the_transaction_send_each_alert_once(kafka_bootstrap, store):
    run = uuid.uuid4().hex[:8]
    node, base, group = f"alert-eos-{run}", _base(), f"alerts-{run}"
    # 1: busy, then the drop begins; the alerter stops while the drop is pending
    produce(kafka_bootstrap, _metrics(node, base, range(0, 25)))
    with _alerts_runner(kafka_bootstrap, group, store) as alerter:
        wait_for(lambda: _gpu_state(alerter, node) == "PENDING", timeout=60, what="a pending drop",
                 running=[alerter])
        wait_for(lambda: alerter.runner.batches > 0 and alerter.runner.stage.next_offset, timeout=10)
    # 2: the drop holds; the alerter that sees it dies inside the transaction that carries the alert
    produce(kafka_bootstrap, _metrics(node, base, range(25, 45)))
    dying = _alerts_runner(kafka_bootstrap, group, store, cls=DiesCommittingAnAlert)
    with dying:
        wait_for(lambda: dying.error is not None, timeout=60, what="the alerter to die")
    assert isinstance(dying.error, Crash)
    # 3: a new instance reads the state back and fires once; another one later resolves the same alert once
    with _alerts_runner(kafka_bootstrap, group, store) as alerter:
        wait_for(lambda: _gpu_state(alerter, node) == "FIRING", timeout=60, what="the alert", running=[alerter])
    produce(kafka_bootstrap, _metrics(node, base, range(45, len(SERIES))))
    with _alerts_runner(kafka_bootstrap, group, store) as alerter:
        wait_for(lambda: _gpu_state(alerter, node) == "ARMED", timeout=60, what="the resolution", running=[alerter])
    alerts = _committed_alerts(kafka_bootstrap, node, 2)
    aid = alert_id(node, f"GPU-{node}", base + 10 * SECOND_NS)
    assert [(a["state"], a["alert_id"], a["time_ns"]) for a in alerts] == [
        ("FIRING", aid, base + 40 * SECOND_NS), ("RESOLVED", aid, base + 65 * SECOND_NS)]


def test_a_webhook_url_that_is_not_http_is_refused_without_echoing_it(kafka_bootstrap):
    with pytest.raises(ValueError) as info:
        AlertWebhook({"bootstrap.servers": kafka_bootstrap}, "ftp://user:hunter2@example.org/x")
    assert "hunter2" not in str(info.value)


def test_the_webhook_logs_name_only_the_host(kafka_bootstrap, caplog):
    hook = Webhook()
    try:
        webhook = AlertWebhook({"bootstrap.servers": kafka_bootstrap}, hook.url, group=f"hook-{uuid.uuid4().hex}")
        assert webhook.where == f"http://127.0.0.1:{hook.server.server_address[1]}/…"
        webhook.close()
    finally:
        hook.close()
    assert "secret" not in caplog.text


def test_dates_in_the_payload_are_utc(kafka_bootstrap):
    from processors.alert_webhook import payload

    body = payload({"started_ns": 0, "time_ns": 1_500_000_000, "alert_id": "a", "state": "FIRING"})
    assert body["started"] == "1970-01-01T00:00:00+00:00"
    assert datetime.fromisoformat(body["time"]) == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=1.5)


def test_evidence_through_the_api_of_fleetprof_up_equals_the_store_s(store):
    """`fleetprof up` runs the alerter as a child process that reads evidence through up's query API."""
    import httpx

    from fleetprof.api import serve_api
    from fleetprof.query_client import ApiTarget

    node, base = f"alert-api-{uuid.uuid4().hex[:8]}", _base()
    _cpu_rows(store, node, base)
    direct = AlertEvidence(lambda name, params: store.query_named(name, params))
    server = serve_api(store, "127.0.0.1", 0)
    try:
        target = ApiTarget(server.address, httpx.Client(base_url=server.url))
        via_api = AlertEvidence(target.named)
        args = (node, [GPU_PID, 7], base + 10 * SECOND_NS, base + 40 * SECOND_NS)
        assert via_api.top_stacks(*args) == direct.top_stacks(*args)
        assert [e["count"] for e in via_api.top_stacks(*args)[0]] == [30, 15]
        target.close()
    finally:
        server.stop()
