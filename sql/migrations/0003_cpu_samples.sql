-- CPU samples, pre-aggregated per reporting window by the processors: one row per (window, process, stack).
--
-- Engine: SummingMergeTree(count). Rows with the same sorting key (two partial aggregates of one window, e.g. from a
-- retried batch or two processor instances) merge into one row whose count is the sum; until a merge happens a query
-- must still sum(count), which every named query does.
-- ORDER BY starts with node, ts: almost every question is "this node (or all nodes) over this time range".
-- PARTITION BY toDate(ts) with TTL 30 days and ttl_only_drop_parts = 1: expired days are dropped as whole
-- partitions instead of being rewritten row by row.
-- non_replicated_deduplication_window = 10000: the sink passes insert_deduplication_token (topic, partition, offset
-- range, table), so re-inserting a batch after a crash between insert and offset commit is a no-op. 10000 remembered
-- blocks cover many minutes of batches; a crash-and-retry lands within seconds.
--
-- Codecs: within a node the rows run in time order, so DoubleDelta on ts (fixed 10 s windows) leaves almost nothing
-- for ZSTD; pid and count are small integers, T64 packs away their unused high bits; the LowCardinality columns are
-- dictionary-encoded already and ZSTD(1) squeezes the index streams; stack_id is a random hash, so plain ZSTD(1).
CREATE TABLE IF NOT EXISTS cpu_samples
(
    ts           DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = SummingMergeTree(count)
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, comm, container_id, stack_id)
TTL ts + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
