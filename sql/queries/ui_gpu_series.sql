-- NVML device readings in [since, until) for the web UI's charts: one row per node, GPU (a MIG instance has its own
-- uuid under its GPU's index) and time bucket of step_ms milliseconds, optionally one node ('' means "all").
-- The rows are point-in-time gauges stored once each (see gpu_metrics), so a bucket averages the readings in it;
-- memory used, the power limit and the temperature take the bucket's peak instead, since a chart that averages them
-- hides the moment a GPU ran out of memory or throttled. avg and max skip NULLs (NVML could not read that field); a
-- bucket where every reading of a field is NULL gives NULL. t_ms is the bucket's start in milliseconds since the
-- epoch. Which readings were simulated the page learns from simulated_sources, per node.
-- @default until = now
-- @default node =
-- @default limit = 200000
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT node, gpu_index, uuid, any(name) AS name, any(parent_uuid) AS parent_uuid,
       intDiv(toUnixTimestamp64Milli(ts), {step_ms:UInt32}) * {step_ms:UInt32} AS t_ms,
       avg(gpu_util_pct) AS gpu_util_pct, avg(mem_util_pct) AS mem_util_pct,
       max(mem_used_bytes) AS mem_used_bytes, max(mem_total_bytes) AS mem_total_bytes,
       avg(sm_clock_mhz) AS sm_clock_mhz, avg(mem_clock_mhz) AS mem_clock_mhz,
       avg(power_mw) AS power_mw, max(power_limit_mw) AS power_limit_mw, max(temperature_c) AS temperature_c,
       avg(pcie_tx_kbps) AS pcie_tx_kbps, avg(pcie_rx_kbps) AS pcie_rx_kbps
FROM
(
    -- @include nvml_device_readings
)
WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_device_filter
GROUP BY node, gpu_index, uuid, t_ms
ORDER BY node, gpu_index, uuid, t_ms
LIMIT {limit:UInt32}
