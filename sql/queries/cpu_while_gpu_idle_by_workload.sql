-- What the CPU did while a GPU sat idle, per workload: cpu_while_gpu_idle's samples (the CPU samples of the processes
-- NVML listed on an idle GPU, in the windows during which it was idle; its header has the rules) grouped by the
-- workload of each sample's identity under {by} (namespace, pod, job, team or container, as workload_keys reads
-- them; '' = unattributed: no identity, or none with that field), optionally for one node / GPU index and for the
-- workloads the filters namespace, pod, job and container pick ('' = no filter).
-- Columns: workload, samples, share (of all such samples), processes (distinct node, pid), windows (distinct node,
-- pid, window). Ties rank by the workload.
-- @default until = now
-- @default node =
-- @default gpu = -1
-- @default threshold = 10
-- @default window_s = 10
-- @default by = pod
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    toInt64({window_s:UInt32}) * 1000 AS window_ms,
    -- @include cpu_samples_while_gpu_idle
    owners AS
    (
        SELECT DISTINCT toString(identity) AS owner FROM samples
    ),
    keys AS
    (
        -- @include workload_keys
    )
SELECT
    k.workload AS workload,
    sum(s.samples) AS samples,
    if(all_samples = 0, 0., samples / all_samples) AS share,
    uniqExact(s.node, s.pid) AS processes,
    uniqExact(s.node, s.pid, s.ts) AS windows
FROM samples AS s
-- a LEFT JOIN fills a sample without a known identity with workload '' (join_use_nulls is off)
LEFT JOIN keys AS k ON k.identity = toString(s.identity)
CROSS JOIN (SELECT sum(samples) AS all_samples FROM samples) AS t
GROUP BY workload, all_samples
ORDER BY samples DESC, workload ASC
