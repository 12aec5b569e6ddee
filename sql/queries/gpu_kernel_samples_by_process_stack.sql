-- GPU kernel time per process and launching stack over [since, until), optionally for one node / pid / comm ('' and 0
-- mean "all"): one row per (node, pid, comm, stack id) with its GPU time in ns. gpu_kernel_samples_by_stack without
-- adding the processes together: whole UTC hours from the hourly rollup gpu_kernel_samples_1h, the ragged edges from
-- the 10 s windows of gpu_kernel_samples (migration 0010), and the same comm filter (GPU rows carry no comm yet, so it
-- also takes the processes the CPU sampler saw under that comm in the range). The per-process GPU flame graph and
-- the pprof export include it (`-- @include gpu_kernel_samples_by_process_stack`).
-- collectives: 'all' (the default), 'hide' or 'only' NCCL's kernels, as in gpu_kernel_samples_by_stack.
-- what: 'all' (the default), 'kernels' (no copies or sets) or 'copies' (only the memory copies and sets, whose
-- kernel_name is their label '[memcpy HtoD]', '[memset]'; migration 0014).
-- nvtx_range: '' (the default: all GPU time) or only the time launched under an NVTX range path that matches it: a
-- text without ' > ' matches a path with an element equal to it ('forward' matches 'step 3 > forward' and
-- 'forward > attention'), a text with ' > ' matches a path starting with those whole elements ('step 3 > forward'
-- matches 'step 3 > forward' and 'step 3 > forward > attention', not 'step 3 > forward2'). Elements are compared
-- whole and exactly (case, spaces, and 'domain:name' for a range of a non-default domain, as the shim writes them).
-- nvtx_level: 0 (the default) sums each stack's time over its NVTX ranges (nvtx_range ''); 1 keeps the range path of
-- its launches apart (nvtx_range), for the flame graphs that show ranges as frames.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default collectives = all
-- @default what = all
-- @default nvtx_range =
-- @default nvtx_level = 0
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    -- [first_hour, end_hour): the whole UTC hours inside the range; empty (first_hour >= end_hour) for a short one
    toStartOfHour({since:DateTime} + INTERVAL 3599 SECOND, 'UTC') AS first_hour,
    toStartOfHour({until:DateTime}, 'UTC') AS end_hour,
    comm_processes AS
    (
        SELECT node, pid FROM cpu_samples_1h WHERE hour >= first_hour AND hour < end_hour AND comm = {comm:String}
        UNION ALL
        SELECT node, pid FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
          AND comm = {comm:String}
    )
-- Summed per process id first and named after (migration 0025), as cpu_samples_by_process_stack.
SELECT node, pid, dictGet('process_names_by_id', 'comm', proc_id) AS comm, stack_id, nvtx_path AS nvtx_range,
       sum(duration_ns) AS duration_ns
FROM
(
SELECT node, pid, proc_id, stack_id, nvtx_path, sum(duration_ns) AS duration_ns
FROM
(
    SELECT node, pid, proc_id, stack_id, if({nvtx_level:UInt8} = 1, toString(nvtx_range), '') AS nvtx_path,
           duration_ns
    FROM gpu_kernel_samples_1h
    WHERE hour >= first_hour AND hour < end_hour
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
      -- @include gpu_kernel_filters
    UNION ALL
    SELECT node, pid, proc_id, stack_id, if({nvtx_level:UInt8} = 1, toString(nvtx_range), '') AS nvtx_path,
           duration_ns
    FROM gpu_kernel_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
      -- @include gpu_kernel_filters
)
GROUP BY node, pid, proc_id, stack_id, nvtx_path
)
GROUP BY node, pid, comm, stack_id, nvtx_path
