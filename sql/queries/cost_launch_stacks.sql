-- The CPU stacks that launched the most GPU time in [since, until), optionally for one node ('' means "all"), for
-- `fleetprof report cost`: stack (the launching CPU stack as folded text "root;…;caller": the GPU stack without its
-- GPU_KERNEL leaf frame, so one row sums every kernel the stack launched), gpu_ns (GPU time in ns), launches and
-- kernels (how many distinct kernels it launched). Stacks that differ only in addresses merge. {limit} rows, most
-- GPU time first, ties by stack text.
-- Same deduplication and naming as top_kernels_gpu_stacks: GPU time and launches are summed (SummingMergeTree rows not
-- merged yet), the stack_names view (migration 0009) picks one definition per stack and frame id with argMax
-- (ReplacingMergeTree rows not merged yet), and a stack or frame without a definition shows as
-- "[unknown stack 0x…]" / "[unknown 0x…]".
-- @default until = now
-- @default node =
-- @default limit = 10
WITH
    samples AS
    (
        SELECT stack_id, kernel_name, sum(duration_ns) AS ns, sum(launches) AS n
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
        GROUP BY stack_id, kernel_name
    ),
    folded AS
    (
        -- @include folded_launching_stacks
    )
SELECT f.stack AS stack, sum(s.ns) AS gpu_ns, sum(s.n) AS launches, uniqExact(s.kernel_name) AS kernels
FROM samples AS s
INNER JOIN folded AS f ON f.stack_id = s.stack_id
GROUP BY stack
ORDER BY gpu_ns DESC, stack ASC
LIMIT {limit:UInt32}
