-- GPU flame graph over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"): one row per
-- distinct root-to-leaf list of function names with its GPU time in ns (the launching CPU stack, root first, then the
-- kernel as the leaf; stacks that differ only in addresses within the same functions merge), ready to print as folded
-- stacks ("root;…;kernel ns"). GPU time per stack comes from gpu_kernel_samples_by_stack (included below: whole UTC
-- hours from the hourly rollup, the ragged edges from the 10 s windows, exactly the sums of gpu_kernel_samples alone;
-- a comm filter also takes the processes the CPU sampler saw under that comm, since GPU rows carry no comm yet).
-- Names come from the stack_names view (migration 0009) with the same deduplication and "[unknown 0x…]" /
-- "[unknown stack 0x…]" naming as flamegraph_cpu.
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
        -- @include gpu_kernel_samples_by_stack
    ),
    named AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, functions FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
    )
-- the NVTX range frames (nvtx_level = 1), then the launching stack
SELECT arrayConcat(arrayMap(range -> concat('[nvtx] ', range),
                            if(s.nvtx_range = '', [], splitByString(' > ', s.nvtx_range))),
                   if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions))
           AS functions,
       sum(s.duration_ns) AS count
FROM samples AS s
LEFT JOIN named AS n ON n.stack_id = s.stack_id
GROUP BY functions
ORDER BY count DESC, functions ASC
