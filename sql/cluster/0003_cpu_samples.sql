-- Generated from sql/migrations/0003_cpu_samples.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: sharded by stack_id, the key of stacks (0002), so a stack's samples and its definition share a shard. All
-- rows of one sorting key (it includes stack_id) land on one shard, so merges still sum partial aggregates into one
-- row; queries sum(count) anyway, through the Distributed table `cpu_samples`, which merges the shards' partial sums
-- on the node that runs the query. One node's rows spread over every shard: each query reads all shards, in parallel.
-- replicated_deduplication_window is the replicated form of non_replicated_deduplication_window: the sink's
-- insert_deduplication_token travels with the insert to each shard, and a re-inserted batch splits across the shards
-- exactly as the first one did, so every shard drops its part as a duplicate.
CREATE TABLE IF NOT EXISTS cpu_samples_local ON CLUSTER '{cluster}'
(
    ts           DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    count        UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/cpu_samples_local', '{replica}', count)
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, comm, container_id, stack_id)
TTL ts + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS cpu_samples ON CLUSTER '{cluster}'
(
    ts           DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    stack_id     UInt64,
    count        UInt64
)
ENGINE = Distributed('{cluster}', currentDatabase(), cpu_samples_local, stack_id);

INSERT INTO schema_migrations (version, name, applied_at) VALUES (3, '0003_cpu_samples', now());
