-- The web UI's GPU flame graph as frame ids, for ranges of 100k distinct stacks: one row per process and sampled
-- launching stack over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"), with the stack's
-- frame ids root first (the kernel is the leaf frame), its GPU time in ns in that process, and the process (node,
-- pid, comm). The same samples, filters and deduplication as flamegraph_processes_gpu: GPU time per process and stack
-- from gpu_kernel_samples_by_process_stack (included below), and each stack's newest definition from the stack_frames
-- view (migration 0009); a stack without a definition, or whose newest definition is empty, has frame_ids [].
-- GPU rows carry no comm yet: a process without one is named, as flamegraph_processes_gpu names it, by the command
-- the CPU sampler saw it run most in the hours the range touches (the hourly rollup; '' when never sampled on CPU).
-- The UI names the frames with flamegraph_names_gpu and merges stacks itself (fleetprof/webui/model.py), as
-- flamegraph_ids_cpu explains. Exports use flamegraph_processes_gpu.
-- collectives: 'all' (the default), 'hide' or 'only' NCCL's kernels, as in gpu_kernel_samples_by_stack.
-- what, nvtx_range: copies and sets, kernels or both, and the NVTX range filter, as in gpu_kernel_samples_by_stack.
-- nvtx_level: 1 puts the launches' NVTX range path between the process and the launching stack, one frame per range,
-- as flamegraph_processes_gpu does: frame ids made up here, cityHash64('[nvtx]', range), which
-- flamegraph_names_gpu names '[nvtx] <range>' (binary '[nvtx]', language 'nvtx'); a stack without a definition then
-- ends in the made-up id cityHash64('[unknown stack]', stack id), which it names "[unknown stack 0x…]".
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
    defined AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, frame_ids FROM stack_frames WHERE stack_id IN (SELECT stack_id FROM samples)
    ),
    commands AS
    (
        -- the busiest command wins, the greater name on a tie (as in flamegraph_processes_gpu)
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
-- a LEFT JOIN fills a stack without a definition with [] (join_use_nulls is off), a process never sampled with ''
SELECT s.stack_id AS stack_id,
       arrayConcat(s.ranges, if(empty(d.frame_ids) AND notEmpty(s.ranges), [cityHash64('[unknown stack]', s.stack_id)],
                                d.frame_ids)) AS frame_ids,
       s.duration_ns AS value,
       toString(s.node) AS node, s.pid AS pid, if(s.comm = '', c.comm, toString(s.comm)) AS comm
FROM
(
    SELECT *, arrayMap(range -> cityHash64('[nvtx]', range),
                       if(nvtx_range = '', [], splitByString(' > ', nvtx_range))) AS ranges
    FROM samples
) AS s
LEFT JOIN defined AS d ON d.stack_id = s.stack_id
LEFT JOIN commands AS c ON c.node = s.node AND c.pid = s.pid
