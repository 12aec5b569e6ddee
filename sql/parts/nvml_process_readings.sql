-- gpu_process_metrics' readings from the tier that holds [since, until) (nvml_tier), as nvml_device_readings does
-- for the devices: the 1 s rows as stored, or one row per process and 10 s bucket of gpu_process_metrics_10s at its
-- first reading, each metric the mean of its readings (NULL where NVML gave none), comm, container_id and identity as
-- the aggregates keep them. Rows from since to until + 1 hour; the including query filters ts itself. A subquery
-- body: include it in parentheses.
SELECT ts, node, gpu_index, pid, comm, container_id, toNullable(toFloat64(sm_util_pct)) AS sm_util_pct,
       toNullable(toFloat64(mem_util_pct)) AS mem_util_pct,
       toNullable(toFloat64(used_memory_bytes)) AS used_memory_bytes, simulated, identity
FROM gpu_process_metrics
WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)} + INTERVAL 1 HOUR
  AND
  -- @include nvml_tier
UNION ALL
SELECT first_ts AS ts, node, gpu_index, pid, comm, container_id,
       if(sm_util_n = 0, NULL, sm_util_sum / sm_util_n) AS sm_util_pct,
       if(mem_util_n = 0, NULL, mem_util_sum / mem_util_n) AS mem_util_pct,
       if(used_memory_n = 0, NULL, used_memory_sum / used_memory_n) AS used_memory_bytes, simulated, identity
FROM
(
    SELECT node, gpu_index, pid, bucket, anyLast(comm) AS comm, anyLast(container_id) AS container_id,
           anyLast(identity) AS identity, max(simulated) AS simulated, min(first_ts) AS first_ts,
           sum(sm_util_sum) AS sm_util_sum, sum(sm_util_n) AS sm_util_n,
           sum(mem_util_sum) AS mem_util_sum, sum(mem_util_n) AS mem_util_n,
           sum(used_memory_sum) AS used_memory_sum, sum(used_memory_n) AS used_memory_n
    FROM gpu_process_metrics_10s
    WHERE bucket >= toStartOfInterval({since:DateTime64(3)}, INTERVAL 10 SECOND, 'UTC')
      AND bucket < {until:DateTime64(3)} + INTERVAL 1 HOUR
      AND NOT
      -- @include nvml_tier
    GROUP BY node, gpu_index, pid, bucket
)
