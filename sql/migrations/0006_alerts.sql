-- Alert transitions from the alerter: one FIRING row when an alert starts, one RESOLVED row when it ends.
--
-- Engine: ReplacingMergeTree(time) ORDER BY (alert_id, state): the alerter may emit the same transition again
-- (restart from a snapshot, redelivery), and at most one row per alert and state should remain, the latest. Readers
-- that need exactness use FINAL or argMax(…, time). No PARTITION BY, so a transition re-emitted in another month
-- still collapses with the first.
-- TTL 90 days: alerts are small and people look back further than at raw samples (postmortems, monthly reviews).
-- The deduplication window lets the sink's insert_deduplication_token make a re-insert after a crash a no-op.
--
-- Codecs: ZSTD(1) on the identifiers and text (evidence is JSON, which ZSTD compresses well); the timestamps are not
-- ordered by the key, so no Delta; threshold and observed are floats that repeat per alert kind, so Gorilla.
--
-- Cluster: sharded by alert_id. alerts.sql reads `alerts FINAL`; on a Distributed table FINAL runs on each shard over
-- that shard's rows only, so every row of one (alert_id, state) must land on one shard: the sharding key is a function
-- of alert_id alone (cityHash64, since a sharding key must be an integer).
-- @cluster sharded by cityHash64(alert_id)
CREATE TABLE IF NOT EXISTS alerts
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
ENGINE = ReplacingMergeTree(time)
ORDER BY (alert_id, state)
TTL toDateTime(time) + INTERVAL 90 DAY
SETTINGS non_replicated_deduplication_window = 10000;
