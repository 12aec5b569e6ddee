-- Top GPU kernels by GPU time in [since, until), each with the CPU stacks that launched it, optionally for one node /
-- pid ('' and 0 mean "all"). One row per (kernel, launching stack), kernels ranked by GPU time and stacks ranked
-- within their kernel:
-- kernel:         the kernel name as the launch records carry it (gpu_kernel_samples.kernel_name);
-- kernel_ns:      the kernel's GPU time (ns) over all its launching stacks (repeated on each of its rows);
-- launches:       the kernel's sampled launches (repeated likewise);
-- share:          kernel_ns / all GPU time in the range that passes the same filters;
-- stack_rank:     1 for the stack that launched the most of this kernel's GPU time, then 2, …;
-- stack:          the launching CPU stack as folded text "root;…;caller": the GPU stack without its GPU_KERNEL leaf
--                 frame (the kernel the correlator appends); stacks that differ only in addresses merge;
-- stack_ns:       GPU time of this kernel launched from that stack; stack_launches likewise.
-- {limit} kernels, and at most {stacks} stacks of each. Ties rank by name / stack text.
-- Same deduplication as top_kernels_gpu: GPU time and launches are summed (SummingMergeTree rows not merged yet), the
-- stack_names view (migration 0009) picks one definition per stack and frame id with argMax (ReplacingMergeTree rows
-- not merged yet), and a stack or frame without a definition shows as "[unknown stack 0x…]" / "[unknown 0x…]" (an
-- unknown leaf stays: it cannot be told from a CPU frame). A ';' or newline inside a function name becomes ':' or ' ',
-- as in folded flame graphs.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default limit = 10
-- @default stacks = 5
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        SELECT kernel_name, stack_id, sum(duration_ns) AS ns, sum(launches) AS n
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
        GROUP BY kernel_name, stack_id
    ),
    kernels AS
    (
        SELECT kernel_name, sum(ns) AS kernel_ns, sum(n) AS launches
        FROM samples
        GROUP BY kernel_name
        ORDER BY kernel_ns DESC, kernel_name ASC
        LIMIT {limit:UInt32}
    ),
    folded AS
    (
        -- @include folded_launching_stacks
    ),
    per_stack AS
    (
        SELECT s.kernel_name AS kernel_name, f.stack AS stack, sum(s.ns) AS stack_ns, sum(s.n) AS stack_launches
        FROM samples AS s
        INNER JOIN folded AS f ON f.stack_id = s.stack_id
        WHERE s.kernel_name IN (SELECT kernel_name FROM kernels)
        GROUP BY kernel_name, stack
    )
SELECT
    k.kernel_name AS kernel,
    k.kernel_ns AS kernel_ns,
    k.launches AS launches,
    if(t.all_ns = 0, 0., k.kernel_ns / t.all_ns) AS share,
    row_number() OVER (PARTITION BY k.kernel_name ORDER BY p.stack_ns DESC, p.stack ASC) AS stack_rank,
    p.stack AS stack,
    p.stack_ns AS stack_ns,
    p.stack_launches AS stack_launches
FROM per_stack AS p
INNER JOIN kernels AS k ON k.kernel_name = p.kernel_name
CROSS JOIN (SELECT sum(ns) AS all_ns FROM samples) AS t
ORDER BY kernel_ns DESC, kernel ASC, stack_rank ASC
LIMIT {stacks:UInt32} BY kernel
