-- CPU flame graph over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"): one row per
-- distinct root-to-leaf list of function names with its sample count (stacks that differ only in addresses within
-- the same functions merge), ready to print as folded stacks ("root;…;leaf count").
-- The samples per stack come from cpu_samples_by_stack (included below): whole UTC hours from the hourly rollup, the
-- ragged edges from the 10 s windows, exactly what cpu_samples alone gives. The stacks' names come from the
-- stack_names view (migration 0009), which picks one definition per stack and frame id with argMax (ReplacingMergeTree
-- rows not merged yet) and names a frame without a definition "[unknown 0x…]". A stack without a definition has no
-- row there and shows as "[unknown stack 0x…]" rather than vanishing from the counts.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        -- @include cpu_samples_by_stack
    ),
    named AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, functions FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
    )
SELECT if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions) AS functions,
       sum(s.count) AS count
FROM samples AS s
LEFT JOIN named AS n ON n.stack_id = s.stack_id
GROUP BY functions
ORDER BY count DESC, functions ASC
