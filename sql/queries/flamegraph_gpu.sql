-- GPU flame graph over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"): one row per
-- distinct root-to-leaf list of function names with its GPU time in ns (the launching CPU stack, root first, then the
-- kernel as the leaf; stacks that differ only in addresses within the same functions merge), ready to print as folded
-- stacks ("root;…;kernel ns"). GPU time is summed (SummingMergeTree rows not merged yet): whole UTC hours from the
-- hourly rollup gpu_kernel_samples_1h, the ragged edges from the 10 s windows of gpu_kernel_samples, exactly the sums
-- of gpu_kernel_samples alone (migration 0010). Names come from the stack_names view (migration 0009) with the same
-- deduplication and "[unknown 0x…]" / "[unknown stack 0x…]" naming as flamegraph_cpu.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
WITH
    -- [first_hour, end_hour): the whole UTC hours inside the range; empty (first_hour >= end_hour) for a short one
    toStartOfHour({since:DateTime} + INTERVAL 3599 SECOND, 'UTC') AS first_hour,
    toStartOfHour({until:DateTime}, 'UTC') AS end_hour,
    -- GPU rows carry no comm yet (launch records have none): a comm filter also takes the processes the CPU sampler
    -- saw under that comm in the range, read like the samples (whole hours from the rollup, the edges from the windows)
    comm_processes AS
    (
        SELECT node, pid FROM cpu_samples_1h WHERE hour >= first_hour AND hour < end_hour AND comm = {comm:String}
        UNION ALL
        SELECT node, pid FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
          AND comm = {comm:String}
    ),
    samples AS
    (
        SELECT stack_id, sum(duration_ns) AS samples
        FROM
        (
            SELECT stack_id, duration_ns
            FROM gpu_kernel_samples_1h
            WHERE hour >= first_hour AND hour < end_hour
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
            UNION ALL
            SELECT stack_id, duration_ns
            FROM gpu_kernel_samples
            WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
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
