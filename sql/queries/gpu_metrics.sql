-- NVML device readings in [since, until), per node and GPU over time; optionally one node and one GPU index
-- ('' and -1 mean "all"). A MIG device shares its GPU's index and names that GPU in parent_uuid. The rows are
-- point-in-time gauges in a plain MergeTree (the sink's insert tokens keep re-deliveries out), so each is returned
-- as stored: nothing to merge or sum. NULL: NVML could not give that field on that device at that time.
-- A range that starts more than 6 h ago (past the 1 s tier, sql/parts/nvml_tier.sql) returns each 10 s bucket's
-- newest reading, its values as read, and the bucket's XID errors.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default limit = 100000
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT ts, node, gpu_index, uuid, name, parent_uuid, gpu_util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes,
       sm_clock_mhz, mem_clock_mhz, power_mw, power_limit_mw, temperature_c, pcie_tx_kbps, pcie_rx_kbps,
       clock_event_reasons, xid_errors, simulated, identity
FROM
(
    SELECT * FROM gpu_device_metrics
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
      AND
      -- @include nvml_tier
    UNION ALL
    -- past the 1 s tier: each 10 s bucket's newest reading, its values as read
    SELECT last_ts AS ts, node, gpu_index, uuid, name, parent_uuid, l.gpu_util_pct AS gpu_util_pct,
           l.mem_util_pct AS mem_util_pct, l.mem_used_bytes AS mem_used_bytes, l.mem_total_bytes AS mem_total_bytes,
           l.sm_clock_mhz AS sm_clock_mhz, l.mem_clock_mhz AS mem_clock_mhz, l.power_mw AS power_mw,
           l.power_limit_mw AS power_limit_mw, l.temperature_c AS temperature_c, l.pcie_tx_kbps AS pcie_tx_kbps,
           l.pcie_rx_kbps AS pcie_rx_kbps, l.clock_event_reasons AS clock_event_reasons, xid_errors, simulated,
           identity
    FROM
    (
        SELECT node, gpu_index, uuid, parent_uuid, bucket, anyLast(name) AS name, anyLast(identity) AS identity,
               max(simulated) AS simulated, max(last_ts) AS last_ts, groupArrayArray(xid_errors) AS xid_errors,
               max(latest) AS l
        FROM gpu_device_metrics_10s
        WHERE bucket >= toStartOfInterval({since:DateTime64(3)}, INTERVAL 10 SECOND, 'UTC')
          AND bucket < {until:DateTime64(3)}
          AND NOT
          -- @include nvml_tier
        GROUP BY node, gpu_index, uuid, parent_uuid, bucket
    )
)
WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_device_filter
  AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
ORDER BY node, ts, gpu_index, parent_uuid, uuid
LIMIT {limit:UInt32}
