-- The CTEs of cpu_while_gpu_idle (its header says the rules), after its `window_ms`: the windows, the GPUs' idle
-- windows, the processes NVML listed on them, and `samples`: the CPU samples of those processes in those windows
-- (stack_id, node, pid, ts, identity, samples), for the workloads the filters pick (workload_filter). It ends with a comma: the including query's own CTEs follow.
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
    FROM
    (
        -- @include nvml_device_readings
    )
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
        FROM
        (
            -- @include nvml_process_readings
        )
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
    SELECT stack_id, node, pid, ts, identity, sum(count) AS samples
    FROM cpu_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
      AND (node, pid, toInt64(toUnixTimestamp(ts)) * 1000) IN (SELECT node, pid, start_ms FROM chosen)
      -- @include workload_filter
    GROUP BY stack_id, node, pid, ts, identity
),
