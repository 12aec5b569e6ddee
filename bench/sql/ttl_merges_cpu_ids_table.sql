-- bench/ttl_merges.py --table cpu, layout daily_process_ids: cpu_samples as bench/sql/ttl_merges_cpu_table.sql, but
-- a process's strings are not stored: they arrive in EPHEMERAL columns and only proc_id, computed from them, is kept
-- (the engine's side of a process-id design; bench/sql/sink_layout_process_ids.sql prices the same at the sink).
-- {hour} seconds stand for an hour; the layout's {engine}, {partition} and {settings}.
CREATE TABLE readings
(
    ts           DateTime64(3)          CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) EPHEMERAL '',
    container_id LowCardinality(String) EPHEMERAL '',
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1)),
    identity     LowCardinality(String) EPHEMERAL '',
    proc_id      UInt64                 DEFAULT cityHash64(comm, container_id, identity) CODEC(ZSTD(1))
)
ENGINE = {engine}
PARTITION BY {partition}
ORDER BY (node, toStartOfInterval(ts, INTERVAL {hour} SECOND), pid, stack_id, ts)
SETTINGS non_replicated_deduplication_window = 10000, {settings}
