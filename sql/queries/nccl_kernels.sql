-- The NCCL kernels that ran in [since, until), optionally on one node ('' means "all"), each with what its name says,
-- read as fleetprof/collectives.py reads it (tests/test_collectives_sql.py holds the two to one corpus of names):
-- kernel_name (as stored), kernel (the function's own name: a mangled name's length prefix spans it, a demangled one
-- ends at its argument list), collective (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, SendRecv, ...),
-- op, dtype (PyTorch's spelling: float32, bfloat16, int8, ...), algorithm and protocol, each '' where the name does
-- not say it (ncclDevKernel_Generic runs whatever collective its launch hands it), then its GPU time in ns (gpu_ns)
-- and launches. The op, algorithm and protocol are those the kernel is specialized for (module doc of
-- collectives.py); a copy (AllGather, AllGatherV, Broadcast, SendRecv) has no op and no element type, whatever
-- placeholders an NCCL 2.8-2.18 name carries. Summed because SummingMergeTree rows of one key may not be merged yet.
-- gpu_collectives includes it.
-- @default until = now
-- @default node =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    extract(kernel_name, '^_Z([0-9]+)') AS length_digits,
    -- ten digits or more span more than any stored name: the rest of it
    if(length_digits = '',
       extract(kernel_name, '^(?:void )?([A-Za-z0-9_]+)'),
       substring(kernel_name, 3 + length(length_digits),
                 if(length(length_digits) > 9, length(kernel_name), toUInt32(length_digits)))) AS kernel,
    -- NCCL >= 2.19: collective, op, type, algorithm, protocol
    extractGroups(kernel, concat(
        '^ncclDevKernel(?:Debug)?_(AllReduce|AllGatherV|AllGather|ReduceScatter|Reduce|Broadcast|SendRecv',
        '|AllToAllPivot)(?:_(Sum|Prod|MinMax|Min|Max|PreMulSum|SumPostDiv)_(i8|u8|i32|u32|i64|u64|f16|f32|f64',
        '|bf16|f8e4m3|f8e5m2))?(?:_(TREE|RING|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(LL128',
        '|LL|SIMPLE))?$')) AS dev_kernel,
    -- NCCL 2.8 to 2.18: collective, algorithm, protocol, op, C type
    extractGroups(kernel, concat(
        '^ncclKernel(?:Debug)?_(AllReduce|AllGatherV|AllGather|ReduceScatter|Reduce|Broadcast|SendRecv',
        '|AllToAllPivot)_(TREE|RING|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)',
        '_(Sum|Prod|MinMax|Min|Max|PreMulSum|SumPostDiv)_(int8_t|uint8_t|int32_t|uint32_t|int64_t|uint64_t|half',
        '|float|double|__nv_bfloat16)$')) AS old_kernel,
    -- symmetric memory (2.27 and later): collective, algorithm (the shortest run that lets the rest match), op, type
    extractGroups(kernel, concat(
        '^ncclSymk?DevKernel_(AllGather|AllReduce|ReduceScatter)_([A-Za-z0-9_]+?)(?:_(sum|avg)_(f32|f16|bf16',
        '|f8e4m3|f8e5m2))?(?:_profile)?$')) AS symmetric_kernel,
    -- [collective, op, type, algorithm, protocol] of the naming that matches, all '' when none does
    multiIf(notEmpty(dev_kernel), dev_kernel,
            notEmpty(old_kernel), [old_kernel[1], old_kernel[4], old_kernel[5], old_kernel[2], old_kernel[3]],
            notEmpty(symmetric_kernel),
            [symmetric_kernel[1], symmetric_kernel[3], symmetric_kernel[4], symmetric_kernel[2], ''],
            ['', '', '', '', '']) AS parts,
    parts[1] IN ('AllGather', 'AllGatherV', 'Broadcast', 'SendRecv') AS copy
SELECT kernel_name, kernel, parts[1] AS collective,
       if(copy, '', transform(parts[2], ['sum', 'avg'], ['Sum', 'Avg'], parts[2])) AS op,
       if(copy, '', transform(parts[3],
          ['i8', 'int8_t', 'u8', 'uint8_t', 'i32', 'int32_t', 'u32', 'uint32_t', 'i64', 'int64_t', 'u64', 'uint64_t',
           'f16', 'half', 'f32', 'float', 'f64', 'double', 'bf16', '__nv_bfloat16', 'f8e4m3', 'f8e5m2'],
          ['int8', 'int8', 'uint8', 'uint8', 'int32', 'int32', 'uint32', 'uint32', 'int64', 'int64', 'uint64', 'uint64',
           'float16', 'float16', 'float32', 'float32', 'float64', 'float64', 'bfloat16', 'bfloat16', 'float8_e4m3',
           'float8_e5m2'], '')) AS dtype,
       parts[4] AS algorithm, parts[5] AS protocol, gpu_ns, launches
FROM
(
    SELECT toString(kernel_name) AS kernel_name, sum(duration_ns) AS gpu_ns, sum(launches) AS launches
    FROM gpu_kernel_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
      AND ({node:String} = '' OR node = {node:String})
      -- @include workload_filter
      AND match(kernel_name, (
          -- @include nccl_kernel_pattern
      ))
    GROUP BY kernel_name
)
ORDER BY gpu_ns DESC, kernel_name ASC
