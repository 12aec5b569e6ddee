-- Generated from sql/migrations/0007_sink_state.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: one replica set spanning every node, like frames (0002): a few rows per topic partition, read whenever a
-- sink is assigned partitions, so every node holds the table whole and the read never leaves the node the sink talks
-- to. The sink inserts these rows without a deduplication token and with deduplication switched off
-- (fleetprof/store.py), so the Replicated engine's block deduplication never drops a state row either.
-- Consistency: a sink that takes over a partition (a restart, a rebalance to another instance) resumes from the newest
-- row of that partition here, and a replica that has not yet received it would send it back to an older range, whose
-- batches may then split differently and escape the deduplication tokens. So the sink's ClickHouse user writes with
-- insert_quorum = 'auto' and reads with select_sequential_consistency = 1 (the fleetprof_sink profile), or every sink
-- instance talks to the same node.
CREATE TABLE IF NOT EXISTS sink_state ON CLUSTER '{cluster}'
(
    topic      LowCardinality(String)           CODEC(ZSTD(1)),
    partition  UInt32                           CODEC(ZSTD(1)),
    min_offset Int64                            CODEC(ZSTD(1)),
    max_offset Int64                            CODEC(ZSTD(1)),
    state      Enum8('BEFORE' = 1, 'AFTER' = 2) CODEC(ZSTD(1)),
    updated    DateTime64(6)                    CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/sink_state', '{shard}-{replica}', updated)
ORDER BY (topic, partition);

INSERT INTO schema_migrations (version, name, applied_at) VALUES (7, '0007_sink_state', now());
