-- Time and bytes moved per launching stack over [since, until), optionally for one node / pid ('' and 0 mean "all")
-- and under one NVTX range (nvtx_range, matched as in gpu_kernel_samples_by_stack; '' means all): one row per
-- launching CPU stack (the GPU stack without its leaf: the kernel, or the copy's or set's label), the biggest GPU time
-- first, with
-- stack:       the launching stack as folded text "root;…;caller", as top_kernels_gpu_stacks folds it (stacks that
--              differ only in addresses merge; a stack without a definition reads "[unknown stack 0x…]");
-- gpu_ns:      all the GPU time it launched (kernels, copies and sets: duration x launch weight), = kernel_ns + copy_ns;
-- kernel_ns:   of that, its kernels'; copy_ns: its memory copies' and sets' ('[memcpy …]', '[memset]', migration 0014);
-- bytes:       the bytes its copies moved and its sets wrote (bytes x launch weight), of which htod_bytes and
--              dtoh_bytes went host to device and device to host, set_bytes were set;
-- copies:      its sampled copy and set launches (weights summed);
-- bytes_per_s: bytes / copy time (0 without copy time): a copy path's effective bandwidth, pageable memory shows low.
-- GPU time from gpu_kernel_samples, bytes from gpu_copy_samples (the same rows of copies and sets, with their bytes),
-- both summed as SummingMergeTree rows of one key may not be merged yet. {limit} stacks.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default nvtx_range =
-- @default limit = 20
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    time_by_stack AS
    (
        WITH startsWith(kernel_name, '[memcpy ') OR startsWith(kernel_name, '[memset') AS copy
        SELECT stack_id, sum(duration_ns) AS gpu_ns, sumIf(duration_ns, NOT copy) AS kernel_ns,
               sumIf(duration_ns, copy) AS copy_ns, sumIf(launches, copy) AS copies
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          -- @include nvtx_range_filter
        GROUP BY stack_id
    ),
    bytes_by_stack AS
    (
        SELECT stack_id, sum(bytes) AS all_bytes, sumIf(bytes, kernel_name = '[memcpy HtoD]') AS htod_bytes,
               sumIf(bytes, kernel_name = '[memcpy DtoH]') AS dtoh_bytes,
               sumIf(bytes, startsWith(kernel_name, '[memset')) AS set_bytes
        FROM gpu_copy_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          -- @include nvtx_range_filter
        GROUP BY stack_id
    ),
    samples AS
    (
        -- a stack id is one leaf: a kernel's or a copy's, so each has its time row, a copy's its bytes row too
        SELECT t.stack_id AS stack_id, t.gpu_ns AS gpu_ns, t.kernel_ns AS kernel_ns, t.copy_ns AS copy_ns,
               t.copies AS copies, b.all_bytes AS bytes, b.htod_bytes AS htod_bytes, b.dtoh_bytes AS dtoh_bytes,
               b.set_bytes AS set_bytes
        FROM time_by_stack AS t
        -- a LEFT JOIN fills a stack without copies with 0 (join_use_nulls is off)
        LEFT JOIN bytes_by_stack AS b ON b.stack_id = t.stack_id
    ),
    folded AS
    (
        -- @include folded_launching_stacks
    )
SELECT f.stack AS stack, sum(s.gpu_ns) AS gpu_ns, sum(s.kernel_ns) AS kernel_ns, sum(s.copy_ns) AS copy_ns,
       sum(s.bytes) AS bytes, sum(s.htod_bytes) AS htod_bytes, sum(s.dtoh_bytes) AS dtoh_bytes,
       sum(s.set_bytes) AS set_bytes, sum(s.copies) AS copies,
       if(copy_ns = 0, 0., bytes / (copy_ns / 1e9)) AS bytes_per_s
FROM samples AS s
INNER JOIN folded AS f ON f.stack_id = s.stack_id
GROUP BY stack
ORDER BY gpu_ns DESC, stack ASC
LIMIT {limit:UInt32}
