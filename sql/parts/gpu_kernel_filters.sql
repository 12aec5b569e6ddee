-- The GPU flame graph's filters, AND lines of a WHERE over gpu_kernel_samples or its rollup, as
-- gpu_kernel_samples_by_stack describes them: collectives ('all', 'hide' or 'only' NCCL's kernels, as
-- nccl_kernel_pattern recognizes them), what ('all', 'kernels' or 'copies': the copies and sets, whose kernel_name is
-- their label '[memcpy HtoD]', '[memset]') and nvtx_range.
AND ({collectives:String} = 'all' OR match(kernel_name, (
        -- @include nccl_kernel_pattern
    )) = ({collectives:String} = 'only'))
AND ({what:String} = 'all' OR (startsWith(kernel_name, '[memcpy ') OR startsWith(kernel_name, '[memset'))
        = ({what:String} = 'copies'))
-- @include nvtx_range_filter
