"""`fleetprof process STAGE`: one processor instance in its consumer group (what a Deployment runs)."""

from __future__ import annotations

import logging
import threading

import click

from fleetprof import logs
from fleetprof.alerting import alert_config, alert_options, evidence_query, webhook_url
from fleetprof.settings import Settings

log = logging.getLogger("fleetprof.process")


STAGE_BATCH_SIZE = {"correlate": 5000}


@click.command("process")
@click.argument("stage", type=click.Choice(["symbolize", "correlate", "alerts", "sink"]))
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=None, help="Messages per batch.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0,
              help="Serve Prometheus /metrics on 127.0.0.1:PORT (0: off).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True, envvar="FLEETPROF_METRICS_HOST",
              help="Address /metrics listens on (e.g. 0.0.0.0 in a pod, for Prometheus to scrape).")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@alert_options
@click.pass_obj
def process(settings: Settings, stage: str, batch_size: int | None, metrics_port: int, metrics_host: str,
            log_level: str, **alert_values: object) -> None:
    """Run one processor STAGE until SIGTERM: symbolize (cpu.stacks → cpu.samples), correlate (gpu.launches +
    gpu.kernels → gpu.samples), alerts (gpu.metrics → alerts, with CPU evidence from the store, and the webhook)
    or sink (→ ClickHouse). The --alert-* options apply to the alerts stage."""
    logs.configure(log_level)
    from processors.metrics import serve_metrics
    from processors.runner import install_sigterm

    stop = threading.Event()
    install_sigterm(stop)
    if metrics_port:
        if metrics_host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("Prometheus /metrics listens on %s, beyond this machine", metrics_host)
        serve_metrics(metrics_port, metrics_host)
    kafka = settings.kafka_config()
    log.info("starting stage %s against %s", stage, settings.kafka)
    if stage == "sink":
        from fleetprof.store import open_store
        from processors.store_writer import StoreRunner

        store = open_store(settings.clickhouse_dsn, settings.database, **settings.clickhouse_credentials())
        try:
            store.migrate()
            kwargs = {"batch_messages": batch_size} if batch_size else {}
            StoreRunner(store, kafka, **kwargs).run(stop)
        finally:
            store.close()
    elif stage == "alerts":
        _run_alerts(settings, alert_values, stop)
    else:
        from processors.runner import TopicRunner
        from processors.symbolize_stage import TOPIC_STAGES

        # a correlator transaction also carries its state's changelog: larger batches amortize it
        default = STAGE_BATCH_SIZE.get(stage)
        kwargs = {"batch_size": batch_size or default} if batch_size or default else {}
        TopicRunner(TOPIC_STAGES[stage](kafka), kafka, **kwargs).run(stop)
    log.info("stage %s stopped", stage)


def _run_alerts(settings: Settings, values: dict, stop: threading.Event) -> None:
    """The alerts stage in its consumer group, and the webhook delivery beside it when a URL is configured."""
    from processors.alert_evidence import AlertEvidence
    from processors.alert_webhook import AlertWebhook, webhook_thread
    from processors.alerts_stage import build_alerts
    from processors.runner import TopicRunner

    config = alert_config(values)
    url = webhook_url(values)
    kafka = settings.kafka_config()
    thread = None
    if url is not None:
        try:
            webhook = AlertWebhook(kafka, url)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        thread = webhook_thread(webhook, stop)
    evidence = AlertEvidence(evidence_query(settings), limit=int(values["alert_evidence_stacks"]))
    # poll often: an alert should go out within a second or two of the poll that fires it
    TopicRunner(build_alerts(kafka, config, evidence), kafka, batch_size=500, poll_timeout=0.2).run(stop)
    if thread is not None:
        stop.set()
        thread.join(timeout=15)
