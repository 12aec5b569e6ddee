-- What the CPU did while a GPU sat idle, in [since, until), optionally for one node / GPU index ('' and -1 mean
-- "all"): the CPU stacks, as folded text "root;…;leaf", of the processes NVML listed on an idle GPU, counted only in
-- the CPU sample windows during which that GPU was idle.
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
WITH
    toInt64({window_s:UInt32}) * 1000 AS window_ms,
    windows AS
    (
        SELECT DISTINCT node, toInt64(toUnixTimestamp(ts)) * 1000 AS start_ms
        FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
    ),
    device_readings AS
    (
        -- the readings up to until + window_s: the last window starting before until ends after it
        SELECT node, gpu_index, toUnixTimestamp64Milli(ts) AS ts_ms, max(gpu_util_pct) AS util
        FROM gpu_device_metrics
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime} + toIntervalMillisecond(window_ms)
          AND parent_uuid = '' AND gpu_util_pct IS NOT NULL
          AND ({node:String} = '' OR node = {node:String})
          AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
        GROUP BY node, gpu_index, ts_ms
    ),
    idle_windows AS
    (
        SELECT r.node AS node, r.gpu_index AS gpu_index, w.start_ms AS start_ms
        FROM device_readings AS r
        ASOF INNER JOIN windows AS w ON r.node = w.node AND r.ts_ms >= w.start_ms
        WHERE r.ts_ms < w.start_ms + window_ms
        GROUP BY node, gpu_index, start_ms
        HAVING avg(r.util) < {threshold:Float64}
    ),
    listed AS
    (
        SELECT DISTINCT p.node AS node, p.gpu_index AS gpu_index, p.pid AS pid, w.start_ms AS start_ms
        FROM
        (
            SELECT node, gpu_index, pid, toUnixTimestamp64Milli(ts) AS ts_ms
            FROM gpu_process_metrics
            WHERE ts >= {since:DateTime} AND ts < {until:DateTime} + toIntervalMillisecond(window_ms)
              AND ({node:String} = '' OR node = {node:String})
              AND ({gpu:Int32} < 0 OR gpu_index = {gpu:Int32})
        ) AS p
        ASOF INNER JOIN windows AS w ON p.node = w.node AND p.ts_ms >= w.start_ms
        WHERE p.ts_ms < w.start_ms + window_ms
    ),
    chosen AS
    (
        SELECT DISTINCT l.node AS node, l.pid AS pid, l.start_ms AS start_ms
        FROM listed AS l
        INNER JOIN idle_windows AS i ON i.node = l.node AND i.gpu_index = l.gpu_index AND i.start_ms = l.start_ms
    ),
    samples AS
    (
        SELECT stack_id, node, pid, ts, sum(count) AS samples
        FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND (node, pid, toInt64(toUnixTimestamp(ts)) * 1000) IN (SELECT node, pid, start_ms FROM chosen)
        GROUP BY stack_id, node, pid, ts
    ),
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
