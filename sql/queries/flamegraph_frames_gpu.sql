-- flamegraph_gpu with the binary of every frame, for the web UI's flame graph (it colors frames by binary): one
-- row per distinct root-to-leaf list of (function, binary) with its GPU time in ns, over [since, until), optionally
-- for one node / pid / comm ('' and 0 mean "all"). The same samples, filters and deduplication as flamegraph_gpu
-- (one definition per stack and frame id from the 0009 views, values are summed), so its counts add up to the same
-- totals; a stack whose frames have no definition gets binary ''. Exports use flamegraph_gpu itself, as the CLI does.
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
        SELECT stack_id, functions, binaries FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
    )
SELECT if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions) AS functions,
       if(empty(n.functions), [''], n.binaries) AS binaries,
       sum(s.samples) AS count
FROM samples AS s
LEFT JOIN named AS n ON n.stack_id = s.stack_id
GROUP BY functions, binaries
ORDER BY count DESC, functions ASC, binaries ASC
