-- NVML's per-process readings in [since, until), with the same optional node / GPU index filters as gpu_metrics
-- ('' and -1 mean "all"). sm_util_pct and mem_util_pct are NULL in a poll that brought no new utilization sample
-- for the process (NVML samples on its own clock; a sample is stored once); used_memory_bytes is NULL for a process
-- that was not running compute work.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default limit = 100000
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT ts, node, gpu_index, pid, comm, container_id, sm_util_pct, mem_util_pct, used_memory_bytes, simulated, identity
FROM gpu_process_metrics
WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_filter
  AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
ORDER BY node, ts, gpu_index, pid
LIMIT {limit:UInt32}
