-- NVML in two tiers: the once-a-second readings (0005) for the last 6 hours, and 10 s aggregates per GPU and per
-- process for the 30 days. At the fleet bench's load (8 GPUs polled once a second against 152 CPU samples per second)
-- the 1 s rows held for 30 days were 1.6 bytes per CPU sample, more than the samples themselves; a 10 s bucket holds
-- min, mean (as sum and count), max and last of every metric in about a fifth of the bytes of its ten readings.
--
-- Buckets: 10 s of Unix time (bucket = the epoch second divisible by 10 at or before ts), the grid the agents' 10 s
-- CPU windows use, so "the GPU's mean utilization in this CPU window" is one bucket in either tier. first_ts and
-- last_ts are the bucket's first and last reading, readings how many rows it holds; each metric has _min, _max, _sum
-- and _n (readings where NVML gave the field: the mean is _sum / _n, NULL fields count nowhere) and the newest
-- reading's values sit in `last` (argMax by ts, one state for all of them, so one timestamp per bucket).
-- What the queries do with them, and which tier they read, sql/parts/nvml_tier.sql says.
--
-- Engine: AggregatingMergeTree. The materialized views turn each block the sink inserts into the 1 s tables (one
-- poll of a node, or a few) into partial aggregates of its buckets, and merges combine a bucket's partial rows
-- (SimpleAggregateFunction min / max / sum, the argMax state); queries aggregate again (min(), max(), sum(),
-- argMaxMerge()) because merges happen whenever they happen. name, identity, comm and container_id are a bucket's
-- newest-merged value (anyLast): they change at most when a pod takes the GPU or a process renames itself.
-- Deduplication: the sink's insert_deduplication_token reaches the views' inserts (as for the hourly rollups, 0010),
-- so a re-inserted batch is dropped here as in the 1 s tables; this table's own deduplication window makes it work.
-- Retention: the 30 days that 0005 kept the readings for; daily partitions dropped whole.
-- Codecs: bucket and the reading times rise in steps of ~10 s within a GPU's rows (DoubleDelta); every statistic is
-- an integer near a level with unused high bits (T64, which bench/storage_day.py measured 6-8% smaller than Delta on
-- memory, power and PCIe throughput), all then ZSTD; `last` is one opaque state per bucket, ZSTD(3).
--
-- Existing readings: the INSERTs below fill the aggregates from the 1 s tables before the views exist, once: only
-- while the aggregate table is empty, so running the file again adds nothing. Apply it while no sink writes (fleetprof
-- applies migrations before it starts one), as 0010: a batch inserted between the fill and the view would be missing.
--
-- Cluster: sharded by node like the 1 s tables (0005), so a GPU's buckets sit on the shard of its readings and the
-- views run per shard, from the local 1 s table into the local aggregate table.
-- @cluster sharded by cityHash64(node)
CREATE TABLE IF NOT EXISTS gpu_device_metrics_10s
(
    bucket              DateTime                                                      CODEC(DoubleDelta, ZSTD(1)),
    node                LowCardinality(String)                                        CODEC(ZSTD(1)),
    gpu_index           UInt16                                                        CODEC(T64, ZSTD(1)),
    uuid                LowCardinality(String)                                        CODEC(ZSTD(1)),
    parent_uuid         LowCardinality(String)                                        CODEC(ZSTD(1)),
    name                SimpleAggregateFunction(anyLast, LowCardinality(String))      CODEC(ZSTD(1)),
    identity            SimpleAggregateFunction(anyLast, LowCardinality(String))      CODEC(ZSTD(1)),
    simulated           SimpleAggregateFunction(max, Bool)                            CODEC(ZSTD(1)),
    readings            SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    first_ts            SimpleAggregateFunction(min, DateTime64(3))                   CODEC(DoubleDelta, ZSTD(1)),
    last_ts             SimpleAggregateFunction(max, DateTime64(3))                   CODEC(DoubleDelta, ZSTD(1)),
    gpu_util_min        SimpleAggregateFunction(min, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    gpu_util_max        SimpleAggregateFunction(max, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    gpu_util_sum        SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    gpu_util_n          SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_util_min        SimpleAggregateFunction(min, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    mem_util_max        SimpleAggregateFunction(max, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    mem_util_sum        SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_util_n          SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_used_min        SimpleAggregateFunction(min, Nullable(UInt64))                CODEC(T64, ZSTD(1)),
    mem_used_max        SimpleAggregateFunction(max, Nullable(UInt64))                CODEC(T64, ZSTD(1)),
    mem_used_sum        SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_used_n          SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    sm_clock_min        SimpleAggregateFunction(min, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    sm_clock_max        SimpleAggregateFunction(max, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    sm_clock_sum        SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    sm_clock_n          SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_clock_min       SimpleAggregateFunction(min, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    mem_clock_max       SimpleAggregateFunction(max, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    mem_clock_sum       SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_clock_n         SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    power_min           SimpleAggregateFunction(min, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    power_max           SimpleAggregateFunction(max, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    power_sum           SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    power_n             SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    temperature_min     SimpleAggregateFunction(min, Nullable(Int16))                 CODEC(T64, ZSTD(1)),
    temperature_max     SimpleAggregateFunction(max, Nullable(Int16))                 CODEC(T64, ZSTD(1)),
    temperature_sum     SimpleAggregateFunction(sum, Int64)                           CODEC(T64, ZSTD(1)),
    temperature_n       SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    pcie_tx_min         SimpleAggregateFunction(min, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    pcie_tx_max         SimpleAggregateFunction(max, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    pcie_tx_sum         SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    pcie_tx_n           SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    pcie_rx_min         SimpleAggregateFunction(min, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    pcie_rx_max         SimpleAggregateFunction(max, Nullable(UInt32))                CODEC(T64, ZSTD(1)),
    pcie_rx_sum         SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    pcie_rx_n           SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    clock_events_or     SimpleAggregateFunction(groupBitOr, UInt64)                   CODEC(ZSTD(1)),
    xid_errors          SimpleAggregateFunction(groupArrayArray, Array(UInt32))       CODEC(ZSTD(1)),
    last                AggregateFunction(argMax, Tuple(gpu_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), mem_used_bytes Nullable(UInt64), mem_total_bytes Nullable(UInt64), sm_clock_mhz Nullable(UInt32), mem_clock_mhz Nullable(UInt32), power_mw Nullable(UInt32), power_limit_mw Nullable(UInt32), temperature_c Nullable(Int16), pcie_tx_kbps Nullable(UInt32), pcie_rx_kbps Nullable(UInt32), clock_event_reasons Nullable(UInt64)), DateTime64(3))                                            CODEC(ZSTD(3))
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(bucket)
ORDER BY (node, gpu_index, uuid, parent_uuid, bucket)
TTL bucket + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

INSERT INTO gpu_device_metrics_10s
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
FROM gpu_device_metrics
WHERE (SELECT count() FROM gpu_device_metrics_10s) = 0
GROUP BY node, gpu_index, uuid, parent_uuid, bucket;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_device_metrics_10s_mv TO gpu_device_metrics_10s AS
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
FROM gpu_device_metrics
GROUP BY node, gpu_index, uuid, parent_uuid, bucket;

-- The processes' 10 s aggregates: the same for gpu_process_metrics (0005), per node, GPU and pid.
-- Cluster: sharded by node like the device aggregates.
-- @cluster sharded by cityHash64(node)
CREATE TABLE IF NOT EXISTS gpu_process_metrics_10s
(
    bucket              DateTime                                                      CODEC(DoubleDelta, ZSTD(1)),
    node                LowCardinality(String)                                        CODEC(ZSTD(1)),
    gpu_index           UInt16                                                        CODEC(T64, ZSTD(1)),
    pid                 UInt32                                                        CODEC(T64, ZSTD(1)),
    comm                SimpleAggregateFunction(anyLast, LowCardinality(String))      CODEC(ZSTD(1)),
    container_id        SimpleAggregateFunction(anyLast, LowCardinality(String))      CODEC(ZSTD(1)),
    identity            SimpleAggregateFunction(anyLast, LowCardinality(String))      CODEC(ZSTD(1)),
    simulated           SimpleAggregateFunction(max, Bool)                            CODEC(ZSTD(1)),
    readings            SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    first_ts            SimpleAggregateFunction(min, DateTime64(3))                   CODEC(DoubleDelta, ZSTD(1)),
    last_ts             SimpleAggregateFunction(max, DateTime64(3))                   CODEC(DoubleDelta, ZSTD(1)),
    sm_util_min         SimpleAggregateFunction(min, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    sm_util_max         SimpleAggregateFunction(max, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    sm_util_sum         SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    sm_util_n           SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_util_min        SimpleAggregateFunction(min, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    mem_util_max        SimpleAggregateFunction(max, Nullable(UInt8))                 CODEC(T64, ZSTD(1)),
    mem_util_sum        SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    mem_util_n          SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    used_memory_min     SimpleAggregateFunction(min, Nullable(UInt64))                CODEC(T64, ZSTD(1)),
    used_memory_max     SimpleAggregateFunction(max, Nullable(UInt64))                CODEC(T64, ZSTD(1)),
    used_memory_sum     SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    used_memory_n       SimpleAggregateFunction(sum, UInt64)                          CODEC(T64, ZSTD(1)),
    last                AggregateFunction(argMax, Tuple(sm_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), used_memory_bytes Nullable(UInt64)), DateTime64(3))       CODEC(ZSTD(3))
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(bucket)
ORDER BY (node, gpu_index, pid, bucket)
TTL bucket + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

INSERT INTO gpu_process_metrics_10s
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
FROM gpu_process_metrics
WHERE (SELECT count() FROM gpu_process_metrics_10s) = 0
GROUP BY node, gpu_index, pid, bucket;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_process_metrics_10s_mv TO gpu_process_metrics_10s AS
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
FROM gpu_process_metrics
GROUP BY node, gpu_index, pid, bucket;

-- The 1 s readings now live 6 hours (sql/parts/nvml_tier.sql: the queries read them for ranges that start within
-- the last 6 hours, the aggregates otherwise). Their daily partitions outlive 6 hours, so rows are deleted by TTL
-- merges (ttl_only_drop_parts off), at most an hour after they expire (merge_with_ttl_timeout). The ALTERs change
-- metadata; the TTL applies to existing parts as a background mutation.
ALTER TABLE gpu_device_metrics MODIFY SETTING ttl_only_drop_parts = 0, merge_with_ttl_timeout = 3600;

ALTER TABLE gpu_device_metrics MODIFY TTL toDateTime(ts) + INTERVAL 6 HOUR;

ALTER TABLE gpu_process_metrics MODIFY SETTING ttl_only_drop_parts = 0, merge_with_ttl_timeout = 3600;

ALTER TABLE gpu_process_metrics MODIFY TTL toDateTime(ts) + INTERVAL 6 HOUR;
