-- CPU samples per stack over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"): one row per
-- sampled stack id with its sample count. Samples are summed (SummingMergeTree rows not merged yet): the whole UTC
-- hours of the range from the hourly rollup cpu_samples_1h, the rest (the ragged edges before the first and after the
-- last whole hour, or all of a range without one) from the 10 s windows of cpu_samples, which adds up to exactly what
-- cpu_samples alone gives (migration 0010; tests/test_rollup.py proves it for every edge).
-- The CPU flame-graph queries include it (`-- @include cpu_samples_by_stack`), so they read the samples one way.
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
SELECT stack_id, sum(count) AS count
FROM
(
    SELECT stack_id, count
    FROM cpu_samples_1h
    WHERE hour >= first_hour AND hour < end_hour
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String})
    UNION ALL
    SELECT stack_id, count
    FROM cpu_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
      AND ({comm:String} = '' OR comm = {comm:String})
)
GROUP BY stack_id
