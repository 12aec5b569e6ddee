-- The query bench's second peer: flamegraph_cpu as it read before the hourly rollup (migration 0010), every row from
-- the 10 s windows of cpu_samples. Same parameters and the same result as sql/queries/flamegraph_cpu.sql, which the
-- bench checks on its data; the difference in time is what the rollup buys.
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
