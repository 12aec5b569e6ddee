-- The names of the frames that flamegraph_ids_gpu returns for the same parameters: one row per defined frame id
-- (its function and binary, the newest definition from the frame_names view, migration 0009) of the launching stacks
-- of the GPU kernels sampled over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"), the
-- stacks of gpu_kernel_samples_by_stack (included below) as in flamegraph_ids_gpu. A frame id without a row here has
-- no definition: the UI names it "[unknown 0x<frame id>]" with binary ''. Frame ids come from every stored definition
-- of the sampled stacks, as flamegraph_names_cpu explains.
-- collectives: 'all' (the default), 'hide' or 'only' NCCL's kernels, as in gpu_kernel_samples_by_stack.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default collectives = all
WITH
    samples AS
    (
        -- @include gpu_kernel_samples_by_stack
    )
SELECT frame_id, function, toString(binary) AS binary, toString(language) AS language
FROM frame_names
WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM stacks WHERE stack_id IN (SELECT stack_id FROM samples))
