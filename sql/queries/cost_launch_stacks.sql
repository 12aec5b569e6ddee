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
        SELECT s.stack_id AS stack_id,
               arrayStringConcat(arrayMap(fn -> replaceAll(replaceAll(fn, ';', ':'), '\n', ' '),
                   if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')],
                      arrayFilter((fn, kind) -> kind != 'GPU_KERNEL', n.functions, n.kinds))),
                   ';') AS stack
        FROM (SELECT DISTINCT stack_id FROM samples) AS s
        LEFT JOIN
        (
            -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
            SELECT stack_id, functions, kinds FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
        ) AS n ON n.stack_id = s.stack_id
    )
SELECT f.stack AS stack, sum(s.ns) AS gpu_ns, sum(s.n) AS launches, uniqExact(s.kernel_name) AS kernels
FROM samples AS s
INNER JOIN folded AS f ON f.stack_id = s.stack_id
GROUP BY stack
ORDER BY gpu_ns DESC, stack ASC
LIMIT {limit:UInt32}
