-- CPU flame graph over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"): one row per
-- distinct root-to-leaf list of function names with its sample count (stacks that differ only in addresses within
-- the same functions merge), ready to print as folded stacks ("root;…;leaf count").
-- Samples are summed (SummingMergeTree rows not merged yet): the whole UTC hours of the range from the hourly rollup
-- cpu_samples_1h, the rest (the ragged edges before the first and after the last whole hour, or all of a range
-- without one) from the 10 s windows of cpu_samples, which adds up to exactly what cpu_samples alone gives
-- (migration 0010). The stacks' names come from the stack_names view (migration 0009), which picks one definition per
-- stack and frame id with argMax (ReplacingMergeTree rows not merged yet) and names a frame without a definition
-- "[unknown 0x…]". A stack without a definition has no row there and shows as "[unknown stack 0x…]" rather than
-- vanishing from the counts.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
WITH
    -- [first_hour, end_hour): the whole hours inside the range; empty (first_hour >= end_hour) for a short range
    toStartOfHour({since:DateTime} + INTERVAL 3599 SECOND, 'UTC') AS first_hour,
    toStartOfHour({until:DateTime}, 'UTC') AS end_hour,
    samples AS
    (
        SELECT stack_id, sum(count) AS samples
        FROM
        (
            SELECT stack_id, count
            FROM cpu_samples_1h
            WHERE hour >= first_hour AND hour < end_hour
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String})
            UNION ALL
            SELECT stack_id, count
            FROM cpu_samples
            WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String})
        )
        GROUP BY stack_id
    ),
    named AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, functions FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
    )
SELECT if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions) AS functions,
       sum(s.samples) AS count
FROM samples AS s
LEFT JOIN named AS n ON n.stack_id = s.stack_id
GROUP BY functions
ORDER BY count DESC, functions ASC
