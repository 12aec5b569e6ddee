"""Wiring of the alerts stage for a process: thresholds from flags (or FLEETPROF_ALERT_* env), evidence through the
store's query path, and the webhook from FLEETPROF_ALERT_WEBHOOK_URL or a file (a URL may carry a token, so never
a flag: flags show in `ps`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleetprof.durations import parse_duration
from fleetprof.query_client import query_target
from fleetprof.settings import Settings
from processors.alerts import SECOND_NS, AlertConfig

if TYPE_CHECKING:
    from fleetprof.stage_registry import StageContext
    from processors.alerts_stage import AlertsStage

WEBHOOK_ENV = "FLEETPROF_ALERT_WEBHOOK_URL"
WEBHOOK_FILE_ENV = "FLEETPROF_ALERT_WEBHOOK_URL_FILE"


def alert_options(func: Callable) -> Callable:
    """The detector's flags, each also read from its FLEETPROF_ALERT_* variable (how `fleetprof up` passes them)."""
    pct = click.FloatRange(0, 100)
    for option in reversed([
        click.option("--alert-below", type=pct, default=20.0, show_default=True, envvar="FLEETPROF_ALERT_BELOW",
                     help="Alert when GPU utilization (%) stays below this..."),
        click.option("--alert-for", default="30s", show_default=True, envvar="FLEETPROF_ALERT_FOR",
                     help="...for at least this long (e.g. 30s, 2m)..."),
        click.option("--alert-busy-above", type=pct, default=50.0, show_default=True,
                     envvar="FLEETPROF_ALERT_BUSY_ABOVE",
                     help="...after having been at or above this (%): an idle GPU never alerts."),
        click.option("--alert-recover-above", type=pct, default=40.0, show_default=True,
                     envvar="FLEETPROF_ALERT_RECOVER_ABOVE",
                     help="Resolve once utilization (%) is back at or above this... (hysteresis)"),
        click.option("--alert-recover-for", default="15s", show_default=True, envvar="FLEETPROF_ALERT_RECOVER_FOR",
                     help="...for at least this long."),
        click.option("--alert-evidence-stacks", type=click.IntRange(1, 1000), default=10, show_default=True,
                     envvar="FLEETPROF_ALERT_EVIDENCE_STACKS", help="CPU stacks attached to each alert."),
        click.option("--alert-webhook-url-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     default=None, envvar=WEBHOOK_FILE_ENV,
                     help=f"POST every alert as JSON to the URL in this file (or set {WEBHOOK_ENV})."),
    ]):
        func = option(func)
    return func


def alert_config(values: dict[str, Any]) -> AlertConfig:
    """AlertConfig from the options' values; a one-line click error on a bad one."""
    try:
        return AlertConfig(below=values["alert_below"], busy_above=values["alert_busy_above"],
                           hold_ns=round(parse_duration(values["alert_for"]) * SECOND_NS),
                           recover_above=values["alert_recover_above"],
                           recover_ns=round(parse_duration(values["alert_recover_for"]) * SECOND_NS))
    except ValueError as exc:
        raise click.ClickException(f"alert settings: {exc}") from None


def alert_env(values: dict[str, Any]) -> dict[str, str]:
    """The options' values as the FLEETPROF_ALERT_* variables that `fleetprof process alerts` reads (checked first,
    so `fleetprof up` with a bad setting stops before starting anything)."""
    alert_config(values)
    env = {"FLEETPROF_ALERT_BELOW": str(values["alert_below"]), "FLEETPROF_ALERT_FOR": str(values["alert_for"]),
           "FLEETPROF_ALERT_BUSY_ABOVE": str(values["alert_busy_above"]),
           "FLEETPROF_ALERT_RECOVER_ABOVE": str(values["alert_recover_above"]),
           "FLEETPROF_ALERT_RECOVER_FOR": str(values["alert_recover_for"]),
           "FLEETPROF_ALERT_EVIDENCE_STACKS": str(values["alert_evidence_stacks"])}
    if values.get("alert_webhook_url_file") is not None:
        env[WEBHOOK_FILE_ENV] = str(Path(values["alert_webhook_url_file"]).resolve())
    return env


def webhook_url(values: dict[str, Any]) -> str | None:
    """The webhook URL from the file option, else from FLEETPROF_ALERT_WEBHOOK_URL; None when neither is set."""
    path = values.get("alert_webhook_url_file")
    if path is not None:
        text = Path(path).read_text().strip()
        if not text:
            raise click.ClickException(f"the alert webhook URL file {path} is empty")
        return text
    return os.environ.get(WEBHOOK_ENV, "").strip() or None


def evidence_query(settings: Settings) -> Callable[[str, dict[str, Any]], tuple[list[str], list[list[Any]]]]:
    """Named queries through the store's usual path: `fleetprof up`'s API when it answers, else the store itself.
    Opened per call, so a standalone alerter never keeps an embedded store locked."""

    def query(name: str, params: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
        with query_target(settings) as target:
            return target.named(name, params)

    return query


def build_alerts_stage(context: StageContext) -> AlertsStage:
    """The alerts stage from the --alert-* options, with evidence through the store's query path; the webhook
    delivery runs beside it when a URL is configured, until the process stops."""
    from processors.alert_evidence import AlertEvidence
    from processors.alert_webhook import AlertWebhook, webhook_thread
    from processors.alerts_stage import build_alerts

    values = context.options
    config = alert_config(values)
    url = webhook_url(values)
    if url is not None:
        try:
            webhook = AlertWebhook(context.kafka, url)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        thread = webhook_thread(webhook, context.stop)
        context.resources.callback(_stop_webhook, thread, context.stop)
    evidence = AlertEvidence(evidence_query(context.settings), limit=int(values["alert_evidence_stacks"]))
    return build_alerts(context.kafka, config, evidence)


def _stop_webhook(thread: threading.Thread, stop: threading.Event) -> None:
    stop.set()
    thread.join(timeout=15)
