-- The CPU stacks that launched the most GPU time in [since, until), optionally for one node ('' means "all"), for
-- `fleetprof report cost`: stack (the launching CPU stack as folded text "root;…;caller": the GPU stack without its
-- GPU_KERNEL leaf frame, so one row sums every kernel the stack launched), gpu_ns (GPU time in ns), launches and
-- kernels (how many distinct kernels it launched). Stacks that differ only in addresses merge. {limit} rows, most
-- GPU time first, ties by stack text.
-- Same deduplication and naming as top_kernels_gpu_stacks: GPU time and launches are summed (SummingMergeTree rows not
-- merged yet), argMax picks one definition per stack and frame id (ReplacingMergeTree rows not merged yet), and a
-- stack or frame without a definition shows as "[unknown stack 0x…]" / "[unknown 0x…]".
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
    definitions AS
    (
        SELECT stack_id, argMax(frame_ids, last_seen) AS frame_ids
        FROM stacks
        WHERE stack_id IN (SELECT stack_id FROM samples)
        GROUP BY stack_id
    ),
    positions AS
    (
        SELECT stack_id, defined, frame_id, position
        FROM
        (
            SELECT s.stack_id AS stack_id, notEmpty(d.frame_ids) AS defined,
                   if(defined, d.frame_ids, [toUInt64(0)]) AS frames
            FROM (SELECT DISTINCT stack_id FROM samples) AS s
            LEFT JOIN definitions AS d ON d.stack_id = s.stack_id
        )
        ARRAY JOIN frames AS frame_id, arrayEnumerate(frames) AS position
    ),
    names AS
    (
        SELECT frame_id, argMax(function, last_seen) AS fn, argMax(kind, last_seen) = 'GPU_KERNEL' AS is_kernel,
               1 AS known
        FROM frames
        WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM definitions)
        GROUP BY frame_id
    ),
    folded AS
    (
        SELECT p.stack_id AS stack_id,
               -- groupArray has no order; sorting by position restores root first, leaf last
               arrayStringConcat(arrayMap(x -> x.2, arrayFilter(x -> x.3 = 0, arraySort(x -> x.1, groupArray((
                   p.position,
                   multiIf(p.defined = 0, concat('[unknown stack 0x', lower(hex(p.stack_id)), ']'),
                           n.known = 1, replaceAll(replaceAll(n.fn, ';', ':'), '\n', ' '),
                           concat('[unknown 0x', lower(hex(p.frame_id)), ']')),
                   if(n.known = 1, toUInt8(n.is_kernel), 0)))))), ';') AS stack
        FROM positions AS p
        LEFT JOIN names AS n ON n.frame_id = p.frame_id
        GROUP BY stack_id
    )
SELECT f.stack AS stack, sum(s.ns) AS gpu_ns, sum(s.n) AS launches, uniqExact(s.kernel_name) AS kernels
FROM samples AS s
INNER JOIN folded AS f ON f.stack_id = s.stack_id
GROUP BY stack
ORDER BY gpu_ns DESC, stack ASC
LIMIT {limit:UInt32}
