-- The names of the frames that flamegraph_ids_gpu returns for the same parameters: one row per defined frame id
-- (its function and binary, the newest definition from the frame_names view, migration 0009) of the launching stacks
-- of the GPU kernels sampled over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"), the
-- stacks of gpu_kernel_samples_by_stack (included below) as in flamegraph_ids_gpu. A frame id without a row here has
-- no definition: the UI names it "[unknown 0x<frame id>]" with binary ''. Frame ids come from every stored definition
-- of the sampled stacks, as flamegraph_names_cpu explains.
-- collectives: 'all' (the default), 'hide' or 'only' NCCL's kernels, as in gpu_kernel_samples_by_stack.
-- what, nvtx_range, nvtx_level: as in flamegraph_ids_gpu, whose made-up frame ids (NVTX ranges, stacks without a
-- definition under a range) are named here too: '[nvtx] <range>' (binary '[nvtx]', language 'nvtx') and
-- "[unknown stack 0x…]" (binary '', language 'unknown').
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
    )
SELECT frame_id, function, toString(binary) AS binary, toString(language) AS language
FROM frame_names
WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM stacks WHERE stack_id IN (SELECT stack_id FROM samples))
UNION ALL
SELECT DISTINCT cityHash64('[nvtx]', range) AS frame_id, concat('[nvtx] ', range) AS function, '[nvtx]' AS binary,
       'nvtx' AS language
FROM samples
ARRAY JOIN if(nvtx_range = '', [], splitByString(' > ', nvtx_range)) AS range
UNION ALL
SELECT DISTINCT cityHash64('[unknown stack]', stack_id) AS frame_id,
       concat('[unknown stack 0x', lower(hex(stack_id)), ']') AS function, '' AS binary, 'unknown' AS language
FROM samples
WHERE nvtx_range != ''
