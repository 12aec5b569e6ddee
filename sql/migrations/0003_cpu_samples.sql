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
--
-- Cluster: sharded by stack_id, the key of stacks (0002), so a stack's samples and its definition share a shard. All
-- rows of one sorting key (it includes stack_id) land on one shard, so merges still sum partial aggregates into one
-- row; queries sum(count) anyway, through the Distributed table `cpu_samples`, which merges the shards' partial sums
-- on the node that runs the query. One node's rows spread over every shard: each query reads all shards, in parallel.
-- replicated_deduplication_window is the replicated form of non_replicated_deduplication_window: the sink's
-- insert_deduplication_token travels with the insert to each shard, and a re-inserted batch splits across the shards
-- exactly as the first one did, so every shard drops its part as a duplicate.
-- @cluster sharded by stack_id
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
