-- What the CPU did while a GPU sat idle, in [since, until), optionally for one node / GPU index ('' and -1 mean
-- "all") and for the workloads that the filters namespace, pod, job and container pick (workload_match; '' = no
-- filter: the samples' identity): the CPU stacks, as folded text "root;…;leaf", of the processes NVML listed on an
-- idle GPU, counted only in the CPU sample windows during which that GPU was idle.
-- Windows: cpu_samples.ts is the start of a reporting window of window_s seconds (default 10, the agent's default);
--   a reading at time t (device or process) belongs to the window of its node that starts latest at or before t,
--   if t < start + window_s.
-- Idle: a window is idle for a GPU (physical GPUs only, parent_uuid = '') when the plain mean of that GPU's non-NULL
--   gpu_util_pct readings in the window is below threshold (default 10 %). A window without such a reading of the
--   GPU is not judged, so it never counts as idle.
-- Processes: a process counts in an idle window of a GPU if gpu_process_metrics has a row for it on that GPU in that
--   window (any row: NVML listed it). A process idle on two GPUs in one window counts once.
-- Columns: stack, samples (CPU samples of those processes in those windows), share (samples / all such samples),
--   processes (distinct node, pid), windows (distinct node, pid, window: how long it was seen, in windows).
-- Same deduplication as flamegraph_cpu: samples are summed (SummingMergeTree rows not merged yet), the stack_names view
-- (migration 0009) picks one definition per stack and frame id with argMax (ReplacingMergeTree rows not merged yet),
-- and a stack or frame without a definition shows as "[unknown stack 0x…]" / "[unknown 0x…]". A timestamp stored twice
-- for one GPU is one reading. Ties rank by the stack text.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default threshold = 10
-- @default window_s = 10
-- @default limit = 20
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    toInt64({window_s:UInt32}) * 1000 AS window_ms,
    -- @include cpu_samples_while_gpu_idle
    folded AS
    (
        SELECT s.stack_id AS stack_id,
               arrayStringConcat(arrayMap(fn -> replaceAll(replaceAll(fn, ';', ':'), '\n', ' '),
                   if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions)),
                   ';') AS stack
        FROM (SELECT DISTINCT stack_id FROM samples) AS s
        LEFT JOIN
        (
            -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
            SELECT stack_id, functions FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
        ) AS n ON n.stack_id = s.stack_id
    )
SELECT
    f.stack AS stack,
    sum(s.samples) AS samples,
    if(all_samples = 0, 0., samples / all_samples) AS share,
    uniqExact(s.node, s.pid) AS processes,
    uniqExact(s.node, s.pid, s.ts) AS windows
FROM samples AS s
INNER JOIN folded AS f ON f.stack_id = s.stack_id
CROSS JOIN (SELECT sum(samples) AS all_samples FROM samples) AS t
GROUP BY stack, all_samples
ORDER BY samples DESC, stack ASC
LIMIT {limit:UInt32}
