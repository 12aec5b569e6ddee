-- The 10 s NVML aggregates (0016) keep a bucket's newest reading as the largest (ts, values...) tuple, `latest`, a
-- SimpleAggregateFunction(max, Tuple(...)), instead of the argMax state `last`.
--
-- Why: an argMax state is one opaque value per row, its tuple serialized field after field, so ZSTD sees twelve
-- kinds of numbers interleaved; a Tuple column is stored as one column per field (the timestamps together, the power
-- readings together, each null map apart), and a max over tuples compares ts first: the newest reading wins, as
-- argMax by ts did (of two readings with the same ts, the larger values; argMax kept whichever came first). Measured
-- on bench/storage_day.py's store (bench/RESULTS.md): device rows 63.5 -> 57.9 bytes, process rows 19.0 -> 16.3
-- (-0.043 bytes per CPU sample over a day), the same newest reading in every bucket. Merges compare tuples instead
-- of deserializing states (bench/merge_cost.py: 20-30% less per row, inside the VM's spread).
--
-- How: added, not rebuilt. Rows written before this file keep `last` and get `latest` from it through the column's
-- DEFAULT (computed when read, and written when a merge rewrites their part); the views are made again to write
-- `latest` and leave `last` its default, an empty state (~0.05 bytes a row). Queries read max(latest) only. Safe to
-- run again from any statement; apply it while no sink writes (fleetprof applies migrations before it starts one), as
-- 0016: a reading inserted between a view's drop and its creation would be missing from the aggregates.
-- `last` can go once no part holds a state: 30 days after this file (the TTL drops every older part whole) a
-- migration may drop it, after MATERIALIZE COLUMN latest where it should go sooner.
-- Cluster: the column added to the local tables on every node, the views made again per node.
ALTER TABLE gpu_device_metrics_10s ADD COLUMN IF NOT EXISTS latest SimpleAggregateFunction(max, Tuple(ts DateTime64(3), gpu_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), mem_used_bytes Nullable(UInt64), mem_total_bytes Nullable(UInt64), sm_clock_mhz Nullable(UInt32), mem_clock_mhz Nullable(UInt32), power_mw Nullable(UInt32), power_limit_mw Nullable(UInt32), temperature_c Nullable(Int16), pcie_tx_kbps Nullable(UInt32), pcie_rx_kbps Nullable(UInt32), clock_event_reasons Nullable(UInt64))) DEFAULT tuple(last_ts, tupleElement(finalizeAggregation(last), 'gpu_util_pct'), tupleElement(finalizeAggregation(last), 'mem_util_pct'), tupleElement(finalizeAggregation(last), 'mem_used_bytes'), tupleElement(finalizeAggregation(last), 'mem_total_bytes'), tupleElement(finalizeAggregation(last), 'sm_clock_mhz'), tupleElement(finalizeAggregation(last), 'mem_clock_mhz'), tupleElement(finalizeAggregation(last), 'power_mw'), tupleElement(finalizeAggregation(last), 'power_limit_mw'), tupleElement(finalizeAggregation(last), 'temperature_c'), tupleElement(finalizeAggregation(last), 'pcie_tx_kbps'), tupleElement(finalizeAggregation(last), 'pcie_rx_kbps'), tupleElement(finalizeAggregation(last), 'clock_event_reasons')) CODEC(ZSTD(1));

DROP VIEW IF EXISTS gpu_device_metrics_10s_mv;

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
       max(CAST((ts, gpu_util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes, sm_clock_mhz, mem_clock_mhz,
                 power_mw, power_limit_mw, temperature_c, pcie_tx_kbps, pcie_rx_kbps, clock_event_reasons),
                'Tuple(ts DateTime64(3), gpu_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), mem_used_bytes Nullable(UInt64), mem_total_bytes Nullable(UInt64), sm_clock_mhz Nullable(UInt32), mem_clock_mhz Nullable(UInt32), power_mw Nullable(UInt32), power_limit_mw Nullable(UInt32), temperature_c Nullable(Int16), pcie_tx_kbps Nullable(UInt32), pcie_rx_kbps Nullable(UInt32), clock_event_reasons Nullable(UInt64))')) AS latest
FROM gpu_device_metrics
GROUP BY node, gpu_index, uuid, parent_uuid, bucket;

ALTER TABLE gpu_process_metrics_10s ADD COLUMN IF NOT EXISTS latest SimpleAggregateFunction(max, Tuple(ts DateTime64(3), sm_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), used_memory_bytes Nullable(UInt64))) DEFAULT tuple(last_ts, tupleElement(finalizeAggregation(last), 'sm_util_pct'), tupleElement(finalizeAggregation(last), 'mem_util_pct'), tupleElement(finalizeAggregation(last), 'used_memory_bytes')) CODEC(ZSTD(1));

DROP VIEW IF EXISTS gpu_process_metrics_10s_mv;

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
       max(CAST((ts, sm_util_pct, mem_util_pct, used_memory_bytes),
                'Tuple(ts DateTime64(3), sm_util_pct Nullable(UInt8), mem_util_pct Nullable(UInt8), used_memory_bytes Nullable(UInt64))')) AS latest
FROM gpu_process_metrics
GROUP BY node, gpu_index, pid, bucket;
