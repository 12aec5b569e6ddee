-- Top functions and kernels by GPU time (ns) in [since, until), optionally for one node / pid / comm ('' and 0 mean
-- "all"). Every GPU stack is the CPU stack that launched a kernel with the kernel as its leaf frame, so:
-- self:  GPU time of stacks whose leaf is the function: the kernels' own time (a CPU function is never a leaf here);
-- total: GPU time of stacks that contain the function at least once: the time of the kernels it launched, directly
--        or below it; a function that recurs within one stack counts that stack once.
-- Same deduplication as top_functions_cpu: GPU time is summed (SummingMergeTree rows not merged yet), the
-- stack_frame_names view (migration 0009) picks one definition per stack and frame id with argMax (ReplacingMergeTree
-- rows not merged yet), and a stack or frame without a definition shows as "[unknown stack 0x…]" / "[unknown 0x…]"
-- rather than vanishing from the totals.
-- collectives: 'all' (the default), 'hide' (every kernel but NCCL's) or 'only' (NCCL's kernels alone), as
-- nccl_kernel_pattern recognizes them; the UI and `fleetprof query --collectives` hide or isolate collectives so.
-- what, nvtx_range: copies and sets, kernels or both, and the NVTX range filter, as in gpu_kernel_samples_by_stack.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default collectives = all
-- @default what = all
-- @default nvtx_range =
-- @default limit = 20
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        SELECT stack_id, sum(duration_ns) AS samples
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
        GROUP BY stack_id
    ),
    per_stack AS
    (
        -- one row per (stack, function): this is where a recurring function collapses to one count of the stack
        SELECT s.stack_id AS stack_id,
               any(s.samples) AS samples,
               if(f.position = 0, concat('[unknown stack 0x', lower(hex(s.stack_id)), ']'), f.function)
                   AS function_name,
               f.binary AS binary_name,
               max(f.position = f.depth) AS is_leaf
        FROM
        (
            -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
            SELECT stack_id, position, depth, function, binary
            FROM stack_frame_names
            WHERE stack_id IN (SELECT stack_id FROM samples)
        ) AS f
        -- the frames are the big side, so they probe a hash table of the samples rather than fill one; a sampled
        -- stack without a definition comes through with position 0
        RIGHT JOIN samples AS s ON f.stack_id = s.stack_id
        GROUP BY stack_id, function_name, binary_name
    )
SELECT
    function_name AS function,
    binary_name AS binary,
    sumIf(samples, is_leaf = 1) AS self,
    sum(samples) AS total
FROM per_stack
GROUP BY function_name, binary_name
ORDER BY self DESC, total DESC, function ASC, binary ASC
LIMIT {limit:UInt32}
