-- GPU time (ns) and launches per node in [since, until), with the same optional filters as top_kernels_gpu ('' and 0
-- mean "all"): the denominator for a function's share. Summed because SummingMergeTree rows may not be merged yet.
-- collectives: 'all' (the default), 'hide' or 'only' NCCL's kernels, as in gpu_kernel_samples_by_stack.
-- what, nvtx_range: copies and sets, kernels or both, and the NVTX range filter, as in gpu_kernel_samples_by_stack.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default collectives = all
-- @default what = all
-- @default nvtx_range =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
SELECT node, sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples
WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
  AND ({node:String} = '' OR node = {node:String})
  -- @include workload_filter
  AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
  -- GPU rows carry no comm yet (launch records have none): also the processes the CPU sampler saw under it
  AND ({comm:String} = '' OR comm = {comm:String}
       OR (node, pid) IN (SELECT node, pid FROM cpu_samples
                          WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND comm = {comm:String}))
  -- @include gpu_kernel_filters
GROUP BY node
ORDER BY node
