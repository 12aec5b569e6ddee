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
-- Summed per process id first and named after (migration 0025): one dictionary lookup per summed row, not per stored
-- one; then summed again per name, as processes of one pid and comm with other containers or identities were before.
SELECT node, pid, dictGet('process_names_by_id', 'comm', proc_id) AS comm, stack_id, sum(count) AS count
FROM
(
SELECT node, pid, proc_id, stack_id, sum(count) AS count
FROM
(
    SELECT node, pid, proc_id, stack_id, count
    FROM cpu_samples_1h
    WHERE hour >= first_hour AND hour < end_hour
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String})
    UNION ALL
    SELECT node, pid, proc_id, stack_id, count
    FROM cpu_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String})
)
GROUP BY node, pid, proc_id, stack_id
)
GROUP BY node, pid, comm, stack_id
