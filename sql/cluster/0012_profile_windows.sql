-- Generated from sql/migrations/0012_profile_windows.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
CREATE TABLE IF NOT EXISTS profile_windows_local ON CLUSTER '{cluster}'
(
    ts           DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    kind         LowCardinality(String) CODEC(ZSTD(1)),
    simulated    Bool                   CODEC(ZSTD(1)),
    frequency_hz UInt32                 CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/profile_windows_local', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (kind, node, ts)
TTL ts + INTERVAL 30 DAY
SETTINGS ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS profile_windows ON CLUSTER '{cluster}'
(
    ts           DateTime,
    node         LowCardinality(String),
    kind         LowCardinality(String),
    simulated    Bool,
    frequency_hz UInt32
)
ENGINE = Distributed('{cluster}', currentDatabase(), profile_windows_local, cityHash64(node));

INSERT INTO schema_migrations (version, name, applied_at) VALUES (12, '0012_profile_windows', now());
