-- CPU samples per process and stack over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"):
-- one row per (node, pid, comm, stack id) with its sample count. cpu_samples_by_stack without adding the processes
-- together: the whole UTC hours of the range from the hourly rollup cpu_samples_1h, the ragged edges from the 10 s
-- windows of cpu_samples, exactly what cpu_samples alone gives (migration 0010), summed because SummingMergeTree rows
-- may not be merged yet. The per-process flame graph and the pprof export include it
-- (`-- @include cpu_samples_by_process_stack`).
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    -- [first_hour, end_hour): the whole UTC hours inside the range; empty (first_hour >= end_hour) for a short one
    toStartOfHour({since:DateTime} + INTERVAL 3599 SECOND, 'UTC') AS first_hour,
    toStartOfHour({until:DateTime}, 'UTC') AS end_hour
SELECT node, pid, comm, stack_id, sum(count) AS count
FROM
(
    SELECT node, pid, comm, stack_id, count
    FROM cpu_samples_1h
    WHERE hour >= first_hour AND hour < end_hour
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String})
    UNION ALL
    SELECT node, pid, comm, stack_id, count
    FROM cpu_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String})
)
GROUP BY node, pid, comm, stack_id
