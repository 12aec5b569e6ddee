-- CPU flame graph over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"): one row per
-- distinct root-to-leaf list of function names with its sample count (stacks that differ only in addresses within
-- the same functions merge), ready to print as folded stacks ("root;…;leaf count").
-- Samples are summed (SummingMergeTree rows not merged yet); the stacks' names come from the stack_names view
-- (migration 0009), which picks one definition per stack and frame id with argMax (ReplacingMergeTree rows not
-- merged yet) and names a frame without a definition "[unknown 0x…]". A stack without a definition has no row
-- there and shows as "[unknown stack 0x…]" rather than vanishing from the counts.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
WITH
    samples AS
    (
        SELECT stack_id, sum(count) AS samples
        FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          AND ({comm:String} = '' OR comm = {comm:String})
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
