-- Generated from sql/migrations/0006_alerts.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: sharded by alert_id. alerts.sql reads `alerts FINAL`; on a Distributed table FINAL runs on each shard over
-- that shard's rows only, so every row of one (alert_id, state) must land on one shard: the sharding key is a function
-- of alert_id alone (cityHash64, since a sharding key must be an integer).
CREATE TABLE IF NOT EXISTS alerts_local ON CLUSTER '{cluster}'
(
    alert_id  String                                  CODEC(ZSTD(1)),
    kind      LowCardinality(String)                  CODEC(ZSTD(1)),
    state     Enum8('FIRING' = 1, 'RESOLVED' = 2)     CODEC(ZSTD(1)),
    node      LowCardinality(String)                  CODEC(ZSTD(1)),
    gpu_index UInt16                                  CODEC(T64, ZSTD(1)),
    gpu_uuid  LowCardinality(String)                  CODEC(ZSTD(1)),
    started   DateTime64(3)                           CODEC(ZSTD(1)),
    time      DateTime64(3)                           CODEC(ZSTD(1)),
    threshold Float64                                 CODEC(Gorilla, ZSTD(1)),
    observed  Float64                                 CODEC(Gorilla, ZSTD(1)),
    message   String                                  CODEC(ZSTD(1)),
    evidence  String                                  CODEC(ZSTD(3))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/alerts_local', '{replica}', time)
ORDER BY (alert_id, state)
TTL toDateTime(time) + INTERVAL 90 DAY
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS alerts ON CLUSTER '{cluster}'
(
    alert_id  String,
    kind      LowCardinality(String),
    state     Enum8('FIRING' = 1, 'RESOLVED' = 2),
    node      LowCardinality(String),
    gpu_index UInt16,
    gpu_uuid  LowCardinality(String),
    started   DateTime64(3),
    time      DateTime64(3),
    threshold Float64,
    observed  Float64,
    message   String,
    evidence  String
)
ENGINE = Distributed('{cluster}', currentDatabase(), alerts_local, cityHash64(alert_id));

INSERT INTO schema_migrations (version, name, applied_at) VALUES (6, '0006_alerts', now());
