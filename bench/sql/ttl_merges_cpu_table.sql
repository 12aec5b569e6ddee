-- bench/ttl_merges.py --table cpu: cpu_samples (migration 0019's columns, codecs and key, its time scaled: {hour}
-- seconds stand for an hour, ts in ms since several scaled windows share a second), the layout's {engine}, partitioned
-- by {partition}, its merge settings among the layout's {settings}.
CREATE TABLE readings
(
    ts           DateTime64(3)          CODEC(Delta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1)),
    identity     LowCardinality(String) CODEC(ZSTD(1))
)
ENGINE = {engine}
PARTITION BY {partition}
ORDER BY (node, toStartOfInterval(ts, INTERVAL {hour} SECOND), pid, stack_id, comm, container_id, identity, ts)
SETTINGS non_replicated_deduplication_window = 10000, {settings}
