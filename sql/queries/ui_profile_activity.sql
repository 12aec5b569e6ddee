-- How much was profiled over time, for the web UI's activity chart: per time bucket of step_ms milliseconds in
-- [since, until), the CPU samples (kind 'cpu') and the GPU kernel time in ns (kind 'gpu'), optionally for one node /
-- pid ('' and 0 mean "all"). Both tables are SummingMergeTrees whose rows may not be merged yet, so the values are
-- summed, as every profile query does. Rows are stamped with their reporting window's start, so a step shorter than
-- the window shows one bucket per window. t_ms: the bucket's start in milliseconds since the epoch.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT kind, t_ms, value
FROM
(
    SELECT 'cpu' AS kind, intDiv(toInt64(toUnixTimestamp(ts)) * 1000, {step_ms:UInt32}) * {step_ms:UInt32} AS t_ms,
           sum(count) AS value
    FROM cpu_samples
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
    GROUP BY t_ms
    UNION ALL
    SELECT 'gpu' AS kind, intDiv(toInt64(toUnixTimestamp(ts)) * 1000, {step_ms:UInt32}) * {step_ms:UInt32} AS t_ms,
           sum(duration_ns) AS value
    FROM gpu_kernel_samples
    WHERE ts >= {since:DateTime64(3)} AND ts < {until:DateTime64(3)}
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
    GROUP BY t_ms
)
ORDER BY kind, t_ms
