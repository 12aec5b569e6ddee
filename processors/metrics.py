"""Prometheus metrics of the processors (one registry per process; labels carry the stage)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

MESSAGES_IN = Counter("fleetprof_processor_messages_in_total", "Messages consumed", ["stage", "topic"])
BYTES_IN = Counter("fleetprof_processor_bytes_in_total", "Message bytes consumed", ["stage", "topic"])
RECORDS_OUT = Counter("fleetprof_processor_records_out_total", "Records produced to topics", ["stage", "topic"])
ROWS_OUT = Counter("fleetprof_processor_rows_inserted_total", "Rows inserted into ClickHouse", ["stage", "table"])
DEAD_LETTERS = Counter("fleetprof_processor_dead_letters_total", "Messages sent to the dead-letter topic",
                       ["stage", "topic"])
COMMITS = Counter("fleetprof_processor_commits_total", "Batches made durable and committed", ["stage"])
ABORTS = Counter("fleetprof_processor_aborts_total", "Batches aborted and re-read", ["stage"])
STORE_RETRIES = Counter("fleetprof_processor_store_retries_total", "Failed ClickHouse writes retried", ["stage"])
BATCH_SECONDS = Histogram("fleetprof_processor_batch_seconds", "Time to process and commit one batch", ["stage"])
UNKNOWN_FRAMES = Counter("fleetprof_symbolize_unknown_frames_total", "Frames left unsymbolized", ["stage"])
SYMBOL_TABLES = Gauge("fleetprof_symbolize_symbol_tables", "Symbol tables held in memory", ["stage"])
DEBUGINFOD_FETCHES = Counter("fleetprof_symbolize_debuginfod_fetches_total",
                             "debuginfod look-ups by outcome (improved, no_better, not_found, error, mismatch, ...; "
                             "deferred: left for a later batch by the per-batch budget)", ["stage", "outcome"])


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on host:port (loopback unless told otherwise)."""
    start_http_server(port, addr=host)


# --- correlate (CPU launch stacks joined with GPU kernel records) ---
CORRELATE_MATCHED = Counter("fleetprof_correlate_matched_total", "Sampled launches joined with their kernel", ["stage"])
CORRELATE_UNMATCHED = Counter("fleetprof_correlate_unmatched_total",
                              "Launches whose kernel never came (side LAUNCH) and kernels whose launch was never "
                              "seen (side KERNEL), by reason (EXPIRED, LATE, SUPERSEDED, EVICTED: raise "
                              "FLEETPROF_CORRELATE_MAX_PENDING)", ["stage", "side", "reason"])
CORRELATE_AHEAD = Counter("fleetprof_correlate_ahead_of_clock_total",
                          "GPU records stamped more than FLEETPROF_CORRELATE_MAX_AHEAD_S (10 s) past the processor's "
                          "clock: joined as usual, but they do not move the partition's event time", ["stage"])
CORRELATE_GRAPH_LAUNCHES = Counter("fleetprof_correlate_graph_launches_total",
                                   "Sampled CUDA graph launches joined with at least one of their records (each "
                                   "record is a match)", ["stage"])
CORRELATE_PENDING = Gauge("fleetprof_correlate_pending", "Records waiting for their partner", ["stage", "side"])
CORRELATE_REPLAYED = Counter("fleetprof_correlate_replayed_total",
                             "Records skipped because the restored join state already held them", ["stage"])
CORRELATE_RESTORES = Counter("fleetprof_correlate_state_restores_total",
                             "Partitions whose join state was read back from the changelog, by cause",
                             ["stage", "reason"])

# --- alerts (GPU-utilization drops) ---
ALERTS_SENT = Counter("fleetprof_alerts_total", "GPU alerts sent to the alerts topic, by state", ["stage", "state"])
ALERT_RESTORES = Counter("fleetprof_alerts_state_restores_total",
                         "Partitions whose detector state was read back from alerts.state, by cause",
                         ["stage", "reason"])
WEBHOOK_POSTS = Counter("fleetprof_alerts_webhook_posts_total",
                        "Alert webhook POSTs by outcome (delivered, retried)", ["outcome"])
