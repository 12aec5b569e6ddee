-- GPU flame graph over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"): one row per
-- distinct root-to-leaf list of function names with its GPU time in ns (the launching CPU stack, root first, then the
-- kernel as the leaf; stacks that differ only in addresses within the same functions merge), ready to print as folded
-- stacks ("root;…;kernel ns"). GPU time is summed (SummingMergeTree rows not merged yet); names come from the
-- stack_names view (migration 0009) with the same deduplication and "[unknown 0x…]" / "[unknown stack 0x…]" naming
-- as flamegraph_cpu.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
WITH
    samples AS
    (
        SELECT stack_id, sum(duration_ns) AS samples
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          -- GPU rows carry no comm yet (launch records have none): also the processes the CPU sampler saw under it
          AND ({comm:String} = '' OR comm = {comm:String}
               OR (node, pid) IN (SELECT node, pid FROM cpu_samples
                                  WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND comm = {comm:String}))
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
