-- NVML's per-process readings in [since, until) for the web UI's charts: one row per node, GPU, process and time
-- bucket of step_ms milliseconds, optionally one node and one pid ('' and 0 mean "all"). A bucket averages the
-- process's SM and memory-controller utilization samples (NULL ones, polls that brought no new sample, are skipped)
-- and takes the peak of its GPU memory, as ui_gpu_series does for the device. comm is the name NVML's process had in
-- the bucket. t_ms: the bucket's start, epoch ms.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default limit = 200000
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT node, gpu_index, pid, any(comm) AS comm,
       intDiv(toUnixTimestamp64Milli(ts), {step_ms:UInt32}) * {step_ms:UInt32} AS t_ms,
       avg(sm_util_pct) AS sm_util_pct, avg(mem_util_pct) AS mem_util_pct,
       max(used_memory_bytes) AS used_memory_bytes
FROM
(
    -- @include nvml_process_readings
)
WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_filter
  AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
GROUP BY node, gpu_index, pid, t_ms
ORDER BY node, gpu_index, pid, t_ms
LIMIT {limit:UInt32}
