-- The GPU flame graph per process, for the per-process flame graph exports and pprof: over [since, until),
-- optionally for one node / pid / comm ('' and 0 mean "all"), one row per (node, pid, comm, root-to-leaf list of
-- function names and their binaries: the launching CPU stack, then the kernel as the leaf) with its GPU time in ns.
-- GPU time per process and stack comes from gpu_kernel_samples_by_process_stack (included below), the names from the
-- stack_names view (migration 0009) as in flamegraph_gpu, which is this summed over the processes and binaries.
-- GPU rows carry no comm yet: a process without one is named by the command the CPU sampler saw it run most in the
-- hours the range touches (the hourly rollup, whole hours; '' when it was never sampled on CPU).
-- collectives: 'all' (the default), 'hide' or 'only' NCCL's kernels, as in gpu_kernel_samples_by_stack.
-- what, nvtx_range: copies and sets, kernels or both, and the NVTX range filter, as in gpu_kernel_samples_by_stack.
-- nvtx_level: 1 puts the launches' NVTX range path between the root and the launching stack, one frame per range
-- ('[nvtx] step', '[nvtx] forward', binary '[nvtx]'), so the graph shows the time per forward / backward / step;
-- time launched outside any range has no such frame. 0 (the default): no range frames.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default collectives = all
-- @default what = all
-- @default nvtx_range =
-- @default nvtx_level = 0
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        -- @include gpu_kernel_samples_by_process_stack
    ),
    named AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, functions, binaries FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
    ),
    commands AS
    (
        -- the busiest command wins, the greater name on a tie (as in flamegraph_ids_gpu)
        SELECT node, pid, argMax(comm, (samples, comm)) AS comm
        FROM
        (
            SELECT node, pid, toString(comm) AS comm, sum(count) AS samples
            FROM cpu_samples_1h
            WHERE hour >= toStartOfHour({since:DateTime}, 'UTC') AND hour < {until:DateTime}
              AND (node, pid) IN (SELECT node, pid FROM samples WHERE comm = '')
            GROUP BY node, pid, comm
        )
        GROUP BY node, pid
    )
SELECT toString(s.node) AS node, s.pid AS pid, if(s.comm = '', c.comm, toString(s.comm)) AS comm,
       arrayConcat(s.ranges, if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')],
                                n.functions)) AS functions,
       arrayConcat(arrayMap(range -> '[nvtx]', s.ranges), if(empty(n.functions), [''], n.binaries)) AS binaries,
       sum(s.duration_ns) AS count
FROM
(
    -- the NVTX range frames (nvtx_level = 1), put before the launching stack
    SELECT *, arrayMap(range -> concat('[nvtx] ', range),
                       if(nvtx_range = '', [], splitByString(' > ', nvtx_range))) AS ranges
    FROM samples
) AS s
LEFT JOIN named AS n ON n.stack_id = s.stack_id
LEFT JOIN commands AS c ON c.node = s.node AND c.pid = s.pid
GROUP BY node, pid, comm, functions, binaries
ORDER BY count DESC, node ASC, pid ASC, comm ASC, functions ASC, binaries ASC
