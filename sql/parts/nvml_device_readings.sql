-- gpu_device_metrics' readings from the tier that holds [since, until) (nvml_tier): the 1 s rows as stored, or one row
-- per 10 s bucket of gpu_device_metrics_10s standing for the bucket's readings: ts = its first reading, each metric
-- the mean of its readings (NULL where NVML gave none), name and identity as the aggregates keep them. A query that
-- gives each reading the time to the next one (gpu_idle_time) so gets Σ mean × 10 s per bucket, the sum over its
-- readings when they are evenly spaced. Rows from since to until + 1 hour (the queries look past until for the next
-- reading, at most max_gap_s); the including query filters ts itself. A subquery body: include it in parentheses.
SELECT ts, node, gpu_index, uuid, name, parent_uuid, toNullable(toFloat64(gpu_util_pct)) AS gpu_util_pct,
       toNullable(toFloat64(mem_util_pct)) AS mem_util_pct, toNullable(toFloat64(mem_used_bytes)) AS mem_used_bytes,
       toNullable(toFloat64(mem_total_bytes)) AS mem_total_bytes, toNullable(toFloat64(sm_clock_mhz)) AS sm_clock_mhz,
       toNullable(toFloat64(mem_clock_mhz)) AS mem_clock_mhz, toNullable(toFloat64(power_mw)) AS power_mw,
       toNullable(toFloat64(power_limit_mw)) AS power_limit_mw, toNullable(toFloat64(temperature_c)) AS temperature_c,
       toNullable(toFloat64(pcie_tx_kbps)) AS pcie_tx_kbps, toNullable(toFloat64(pcie_rx_kbps)) AS pcie_rx_kbps,
       simulated, identity, toNullable(toFloat64(gpu_util_pct)) AS gpu_util_lo,
       toNullable(toFloat64(gpu_util_pct)) AS gpu_util_hi
FROM gpu_device_metrics
WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} + INTERVAL 1 HOUR
  AND
  -- @include nvml_tier
UNION ALL
SELECT first_ts AS ts, node, gpu_index, uuid, name, parent_uuid,
       if(gpu_util_n = 0, NULL, gpu_util_sum / gpu_util_n) AS gpu_util_pct,
       if(mem_util_n = 0, NULL, mem_util_sum / mem_util_n) AS mem_util_pct,
       if(mem_used_n = 0, NULL, mem_used_sum / mem_used_n) AS mem_used_bytes,
       toNullable(toFloat64(tupleElement(newest, 'mem_total_bytes'))) AS mem_total_bytes,
       if(sm_clock_n = 0, NULL, sm_clock_sum / sm_clock_n) AS sm_clock_mhz,
       if(mem_clock_n = 0, NULL, mem_clock_sum / mem_clock_n) AS mem_clock_mhz,
       if(power_n = 0, NULL, power_sum / power_n) AS power_mw,
       toNullable(toFloat64(tupleElement(newest, 'power_limit_mw'))) AS power_limit_mw,
       if(temperature_n = 0, NULL, temperature_sum / temperature_n) AS temperature_c,
       if(pcie_tx_n = 0, NULL, pcie_tx_sum / pcie_tx_n) AS pcie_tx_kbps,
       if(pcie_rx_n = 0, NULL, pcie_rx_sum / pcie_rx_n) AS pcie_rx_kbps,
       simulated, identity, toNullable(toFloat64(gpu_util_lo)) AS gpu_util_lo,
       toNullable(toFloat64(gpu_util_hi)) AS gpu_util_hi
FROM
(
    SELECT node, gpu_index, uuid, parent_uuid, bucket, anyLast(name) AS name, anyLast(identity) AS identity,
           max(simulated) AS simulated, min(first_ts) AS first_ts,
           sum(gpu_util_sum) AS gpu_util_sum, sum(gpu_util_n) AS gpu_util_n, min(gpu_util_min) AS gpu_util_lo,
           max(gpu_util_max) AS gpu_util_hi,
           sum(mem_util_sum) AS mem_util_sum, sum(mem_util_n) AS mem_util_n,
           sum(mem_used_sum) AS mem_used_sum, sum(mem_used_n) AS mem_used_n,
           sum(sm_clock_sum) AS sm_clock_sum, sum(sm_clock_n) AS sm_clock_n,
           sum(mem_clock_sum) AS mem_clock_sum, sum(mem_clock_n) AS mem_clock_n,
           sum(power_sum) AS power_sum, sum(power_n) AS power_n,
           sum(temperature_sum) AS temperature_sum, sum(temperature_n) AS temperature_n,
           sum(pcie_tx_sum) AS pcie_tx_sum, sum(pcie_tx_n) AS pcie_tx_n,
           sum(pcie_rx_sum) AS pcie_rx_sum, sum(pcie_rx_n) AS pcie_rx_n,
           max(latest) AS newest
    FROM gpu_device_metrics_10s
    WHERE bucket >= toStartOfInterval({since:DateTime64(3)}, INTERVAL 10 SECOND, 'UTC')
      AND bucket < {until:DateTime64(3)} + INTERVAL 1 HOUR
      AND NOT
      -- @include nvml_tier
    GROUP BY node, gpu_index, uuid, parent_uuid, bucket
)
