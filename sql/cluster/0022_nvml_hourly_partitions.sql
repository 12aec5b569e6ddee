-- Generated from sql/migrations/0022_nvml_hourly_partitions.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: this file rebuilds tables, whose deduplication logs start empty: a sink batch left unfinished would be
-- stored twice once a sink writes it again (fleetprof/rebuild_guard.py). So it stops here while one is unfinished:
-- start the sink of the version that began it (it finishes the batch by itself), stop the sinks, run the file again;
-- or, accepting those rows twice, run it from the next statement.
SELECT throwIf(count() > 0, 'fleetprof: a sink batch is unfinished, which this rebuild would store twice: see above')
           AS unfinished_sink_batches
FROM
(
    SELECT
        topic,
        partition,
        argMax(min_offset, updated) AS min_offset,
        argMax(max_offset, updated) AS max_offset,
        argMax(state, updated) AS state,
        max(updated) AS stamp
    FROM sink_state
    WHERE empty([]) OR topic IN []
    GROUP BY topic, partition
)
WHERE state = 'BEFORE';

-- Cluster: copied through the Distributed tables (the same sharding key), the local tables exchanged on every node,
-- the views made again over the local tables.
DROP VIEW IF EXISTS gpu_device_metrics_10s_mv ON CLUSTER '{cluster}';

DROP TABLE IF EXISTS gpu_device_metrics_0022 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_device_metrics_0022_local ON CLUSTER '{cluster}' SYNC;

-- Cluster: its replication path carries the table's UUID, as 0019's copies.
CREATE TABLE IF NOT EXISTS gpu_device_metrics_0022_local ON CLUSTER '{cluster}'
(
    ts                  DateTime64(3)          CODEC(DoubleDelta, ZSTD(1)),
    node                LowCardinality(String) CODEC(ZSTD(1)),
    gpu_index           UInt16                 CODEC(T64, ZSTD(1)),
    uuid                LowCardinality(String) CODEC(ZSTD(1)),
    name                LowCardinality(String) CODEC(ZSTD(1)),
    parent_uuid         LowCardinality(String) CODEC(ZSTD(1)),
    gpu_util_pct        Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_util_pct        Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_used_bytes      Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    mem_total_bytes     Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    sm_clock_mhz        Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    mem_clock_mhz       Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    power_mw            Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    power_limit_mw      Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    temperature_c       Nullable(Int16)        CODEC(Delta, ZSTD(1)),
    pcie_tx_kbps        Nullable(UInt32)       CODEC(T64, ZSTD(1)),
    pcie_rx_kbps        Nullable(UInt32)       CODEC(T64, ZSTD(1)),
    clock_event_reasons Nullable(UInt64)       CODEC(ZSTD(1)),
    xid_errors          Array(UInt32)          CODEC(ZSTD(1)),
    simulated           Bool                   CODEC(ZSTD(1)),
    identity            LowCardinality(String) CODEC(ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}')
PARTITION BY toStartOfHour(ts)
ORDER BY (node, gpu_index, ts)
TTL toDateTime(ts) + INTERVAL 6 HOUR
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_with_ttl_timeout = 3600,
         merge_selector_base = 20;

CREATE TABLE IF NOT EXISTS gpu_device_metrics_0022 ON CLUSTER '{cluster}'
(
    ts                  DateTime64(3),
    node                LowCardinality(String),
    gpu_index           UInt16,
    uuid                LowCardinality(String),
    name                LowCardinality(String),
    parent_uuid         LowCardinality(String),
    gpu_util_pct        Nullable(UInt8),
    mem_util_pct        Nullable(UInt8),
    mem_used_bytes      Nullable(UInt64),
    mem_total_bytes     Nullable(UInt64),
    sm_clock_mhz        Nullable(UInt32),
    mem_clock_mhz       Nullable(UInt32),
    power_mw            Nullable(UInt32),
    power_limit_mw      Nullable(UInt32),
    temperature_c       Nullable(Int16),
    pcie_tx_kbps        Nullable(UInt32),
    pcie_rx_kbps        Nullable(UInt32),
    clock_event_reasons Nullable(UInt64),
    xid_errors          Array(UInt32),
    simulated           Bool,
    identity            LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_device_metrics_0022_local, cityHash64(node));

INSERT INTO gpu_device_metrics_0022 (ts, node, gpu_index, uuid, name, parent_uuid, gpu_util_pct, mem_util_pct,
    mem_used_bytes, mem_total_bytes, sm_clock_mhz, mem_clock_mhz, power_mw, power_limit_mw, temperature_c, pcie_tx_kbps,
    pcie_rx_kbps, clock_event_reasons, xid_errors, simulated, identity)
SELECT ts, node, gpu_index, uuid, name, parent_uuid, gpu_util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes,
       sm_clock_mhz, mem_clock_mhz, power_mw, power_limit_mw, temperature_c, pcie_tx_kbps, pcie_rx_kbps,
       clock_event_reasons, xid_errors, simulated, identity
FROM gpu_device_metrics
WHERE ts > now() - INTERVAL 6 HOUR
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_device_metrics_local AND gpu_device_metrics_0022_local ON CLUSTER '{cluster}';

CREATE OR REPLACE TABLE gpu_device_metrics ON CLUSTER '{cluster}'
(
    ts                  DateTime64(3),
    node                LowCardinality(String),
    gpu_index           UInt16,
    uuid                LowCardinality(String),
    name                LowCardinality(String),
    parent_uuid         LowCardinality(String),
    gpu_util_pct        Nullable(UInt8),
    mem_util_pct        Nullable(UInt8),
    mem_used_bytes      Nullable(UInt64),
    mem_total_bytes     Nullable(UInt64),
    sm_clock_mhz        Nullable(UInt32),
    mem_clock_mhz       Nullable(UInt32),
    power_mw            Nullable(UInt32),
    power_limit_mw      Nullable(UInt32),
    temperature_c       Nullable(Int16),
    pcie_tx_kbps        Nullable(UInt32),
    pcie_rx_kbps        Nullable(UInt32),
    clock_event_reasons Nullable(UInt64),
    xid_errors          Array(UInt32),
    simulated           Bool,
    identity            LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_device_metrics_local, cityHash64(node));

DROP TABLE IF EXISTS gpu_device_metrics_0022 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_device_metrics_0022_local ON CLUSTER '{cluster}' SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_device_metrics_10s_mv ON CLUSTER '{cluster}' TO gpu_device_metrics_10s_local AS
SELECT toDateTime(intDiv(toUnixTimestamp(ts), 10) * 10, 'UTC') AS bucket, node, gpu_index, uuid, parent_uuid,
       anyLast(name) AS name, anyLast(identity) AS identity, max(simulated) AS simulated,
       toUInt64(count()) AS readings, min(ts) AS first_ts, max(ts) AS last_ts,
       min(gpu_util_pct) AS gpu_util_min, max(gpu_util_pct) AS gpu_util_max,
       toUInt64(ifNull(sum(gpu_util_pct), 0)) AS gpu_util_sum, toUInt64(count(gpu_util_pct)) AS gpu_util_n,
       min(mem_util_pct) AS mem_util_min, max(mem_util_pct) AS mem_util_max,
       toUInt64(ifNull(sum(mem_util_pct), 0)) AS mem_util_sum, toUInt64(count(mem_util_pct)) AS mem_util_n,
       min(mem_used_bytes) AS mem_used_min, max(mem_used_bytes) AS mem_used_max,
       toUInt64(ifNull(sum(mem_used_bytes), 0)) AS mem_used_sum, toUInt64(count(mem_used_bytes)) AS mem_used_n,
       min(sm_clock_mhz) AS sm_clock_min, max(sm_clock_mhz) AS sm_clock_max,
       toUInt64(ifNull(sum(sm_clock_mhz), 0)) AS sm_clock_sum, toUInt64(count(sm_clock_mhz)) AS sm_clock_n,
       min(mem_clock_mhz) AS mem_clock_min, max(mem_clock_mhz) AS mem_clock_max,
       toUInt64(ifNull(sum(mem_clock_mhz), 0)) AS mem_clock_sum, toUInt64(count(mem_clock_mhz)) AS mem_clock_n,
       min(power_mw) AS power_min, max(power_mw) AS power_max,
       toUInt64(ifNull(sum(power_mw), 0)) AS power_sum, toUInt64(count(power_mw)) AS power_n,
       min(temperature_c) AS temperature_min, max(temperature_c) AS temperature_max,
       toInt64(ifNull(sum(temperature_c), 0)) AS temperature_sum, toUInt64(count(temperature_c)) AS temperature_n,
       min(pcie_tx_kbps) AS pcie_tx_min, max(pcie_tx_kbps) AS pcie_tx_max,
       toUInt64(ifNull(sum(pcie_tx_kbps), 0)) AS pcie_tx_sum, toUInt64(count(pcie_tx_kbps)) AS pcie_tx_n,
       min(pcie_rx_kbps) AS pcie_rx_min, max(pcie_rx_kbps) AS pcie_rx_max,
       toUInt64(ifNull(sum(pcie_rx_kbps), 0)) AS pcie_rx_sum, toUInt64(count(pcie_rx_kbps)) AS pcie_rx_n,
       groupBitOr(ifNull(clock_event_reasons, 0)) AS clock_events_or, groupArrayArray(xid_errors) AS xid_errors,
       argMaxState(CAST((gpu_util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes, sm_clock_mhz, mem_clock_mhz,
                         power_mw, power_limit_mw, temperature_c, pcie_tx_kbps, pcie_rx_kbps, clock_event_reasons),
                        'Tuple(gpu_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), mem_used_bytes Nullable(UInt64), mem_total_bytes Nullable(UInt64), sm_clock_mhz Nullable(UInt32), mem_clock_mhz Nullable(UInt32), power_mw Nullable(UInt32), power_limit_mw Nullable(UInt32), temperature_c Nullable(Int16), pcie_tx_kbps Nullable(UInt32), pcie_rx_kbps Nullable(UInt32), clock_event_reasons Nullable(UInt64))'),
                   ts) AS last
FROM gpu_device_metrics_local
GROUP BY node, gpu_index, uuid, parent_uuid, bucket;

DROP VIEW IF EXISTS gpu_process_metrics_10s_mv ON CLUSTER '{cluster}';

DROP TABLE IF EXISTS gpu_process_metrics_0022 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_process_metrics_0022_local ON CLUSTER '{cluster}' SYNC;

-- Cluster: its replication path carries the table's UUID, as 0019's copies.
CREATE TABLE IF NOT EXISTS gpu_process_metrics_0022_local ON CLUSTER '{cluster}'
(
    ts                DateTime64(3)          CODEC(DoubleDelta, ZSTD(1)),
    node              LowCardinality(String) CODEC(ZSTD(1)),
    gpu_index         UInt16                 CODEC(T64, ZSTD(1)),
    pid               UInt32                 CODEC(T64, ZSTD(1)),
    comm              LowCardinality(String) CODEC(ZSTD(1)),
    container_id      LowCardinality(String) CODEC(ZSTD(1)),
    sm_util_pct       Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_util_pct      Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    used_memory_bytes Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    simulated         Bool                   CODEC(ZSTD(1)),
    identity          LowCardinality(String) CODEC(ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}')
PARTITION BY toStartOfHour(ts)
ORDER BY (node, gpu_index, pid, ts)
TTL toDateTime(ts) + INTERVAL 6 HOUR
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1, merge_with_ttl_timeout = 3600,
         merge_selector_base = 20;

CREATE TABLE IF NOT EXISTS gpu_process_metrics_0022 ON CLUSTER '{cluster}'
(
    ts                DateTime64(3),
    node              LowCardinality(String),
    gpu_index         UInt16,
    pid               UInt32,
    comm              LowCardinality(String),
    container_id      LowCardinality(String),
    sm_util_pct       Nullable(UInt8),
    mem_util_pct      Nullable(UInt8),
    used_memory_bytes Nullable(UInt64),
    simulated         Bool,
    identity          LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_process_metrics_0022_local, cityHash64(node));

INSERT INTO gpu_process_metrics_0022 (ts, node, gpu_index, pid, comm, container_id, sm_util_pct, mem_util_pct,
    used_memory_bytes, simulated, identity)
SELECT ts, node, gpu_index, pid, comm, container_id, sm_util_pct, mem_util_pct, used_memory_bytes, simulated, identity
FROM gpu_process_metrics
WHERE ts > now() - INTERVAL 6 HOUR
SETTINGS insert_deduplicate = 0, distributed_foreground_insert = 1;

EXCHANGE TABLES gpu_process_metrics_local AND gpu_process_metrics_0022_local ON CLUSTER '{cluster}';

CREATE OR REPLACE TABLE gpu_process_metrics ON CLUSTER '{cluster}'
(
    ts                DateTime64(3),
    node              LowCardinality(String),
    gpu_index         UInt16,
    pid               UInt32,
    comm              LowCardinality(String),
    container_id      LowCardinality(String),
    sm_util_pct       Nullable(UInt8),
    mem_util_pct      Nullable(UInt8),
    used_memory_bytes Nullable(UInt64),
    simulated         Bool,
    identity          LowCardinality(String)
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_process_metrics_local, cityHash64(node));

DROP TABLE IF EXISTS gpu_process_metrics_0022 ON CLUSTER '{cluster}' SYNC;

DROP TABLE IF EXISTS gpu_process_metrics_0022_local ON CLUSTER '{cluster}' SYNC;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_process_metrics_10s_mv ON CLUSTER '{cluster}' TO gpu_process_metrics_10s_local AS
SELECT toDateTime(intDiv(toUnixTimestamp(ts), 10) * 10, 'UTC') AS bucket, node, gpu_index, pid,
       anyLast(comm) AS comm, anyLast(container_id) AS container_id, anyLast(identity) AS identity,
       max(simulated) AS simulated, toUInt64(count()) AS readings, min(ts) AS first_ts, max(ts) AS last_ts,
       min(sm_util_pct) AS sm_util_min, max(sm_util_pct) AS sm_util_max,
       toUInt64(ifNull(sum(sm_util_pct), 0)) AS sm_util_sum, toUInt64(count(sm_util_pct)) AS sm_util_n,
       min(mem_util_pct) AS mem_util_min, max(mem_util_pct) AS mem_util_max,
       toUInt64(ifNull(sum(mem_util_pct), 0)) AS mem_util_sum, toUInt64(count(mem_util_pct)) AS mem_util_n,
       min(used_memory_bytes) AS used_memory_min, max(used_memory_bytes) AS used_memory_max,
       toUInt64(ifNull(sum(used_memory_bytes), 0)) AS used_memory_sum,
       toUInt64(count(used_memory_bytes)) AS used_memory_n,
       argMaxState(CAST((sm_util_pct, mem_util_pct, used_memory_bytes),
                        'Tuple(sm_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), used_memory_bytes Nullable(UInt64))'),
                   ts) AS last
FROM gpu_process_metrics_local
GROUP BY node, gpu_index, pid, bucket;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (22, '0022_nvml_hourly_partitions', now());
