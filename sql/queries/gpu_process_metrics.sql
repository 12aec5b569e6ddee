-- NVML's per-process readings in [since, until), with the same optional node / GPU index filters as gpu_metrics
-- ('' and -1 mean "all"). sm_util_pct and mem_util_pct are NULL in a poll that brought no new utilization sample
-- for the process (NVML samples on its own clock; a sample is stored once); used_memory_bytes is NULL for a process
-- that was not running compute work.
-- A range that starts more than 6 h ago (past the 1 s tier, sql/parts/nvml_tier.sql) returns each process's newest
-- reading of each 10 s bucket, its values as read.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default limit = 100000
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT ts, node, gpu_index, pid, comm, container_id, sm_util_pct, mem_util_pct, used_memory_bytes, simulated, identity
FROM
(
    SELECT * FROM gpu_process_metrics
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
      AND
      -- @include nvml_tier
    UNION ALL
    -- past the 1 s tier: each process's newest reading of each 10 s bucket, its values as read
    SELECT last_ts AS ts, node, gpu_index, pid, comm, container_id, l.sm_util_pct AS sm_util_pct,
           l.mem_util_pct AS mem_util_pct, l.used_memory_bytes AS used_memory_bytes, simulated, identity
    FROM
    (
        SELECT node, gpu_index, pid, bucket, anyLast(comm) AS comm, anyLast(container_id) AS container_id,
               anyLast(identity) AS identity, max(simulated) AS simulated, max(last_ts) AS last_ts,
               max(latest) AS l
        FROM gpu_process_metrics_10s
        WHERE bucket >= toStartOfInterval({since:DateTime64(3)}, INTERVAL 10 SECOND, 'UTC')
          AND bucket < {until:DateTime64(3)}
          AND NOT
          -- @include nvml_tier
        GROUP BY node, gpu_index, pid, bucket
    )
)
WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_filter
  AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
ORDER BY node, ts, gpu_index, pid
LIMIT {limit:UInt32}
