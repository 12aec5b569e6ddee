-- Top functions and kernels by GPU time (ns) in [since, until), optionally for one node / pid / comm ('' and 0 mean
-- "all"). Every GPU stack is the CPU stack that launched a kernel with the kernel as its leaf frame, so:
-- self:  GPU time of stacks whose leaf is the function: the kernels' own time (a CPU function is never a leaf here);
-- total: GPU time of stacks that contain the function at least once: the time of the kernels it launched, directly
--        or below it; a function that recurs within one stack counts that stack once.
-- Same deduplication as top_functions_cpu: argMax picks one definition per stack and frame id (ReplacingMergeTree
-- rows not merged yet), GPU time is summed (SummingMergeTree rows not merged yet), and a stack or frame without a
-- definition shows as "[unknown stack 0x…]" / "[unknown 0x…]" rather than vanishing from the totals.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default limit = 20
WITH
    samples AS
    (
        SELECT stack_id, sum(duration_ns) AS samples
        FROM gpu_kernel_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          -- GPU rows carry no comm yet (launch records have none): also the processes the CPU sampler saw under it
          AND ({comm:String} = '' OR comm = {comm:String}
               OR (node, pid) IN (SELECT node, pid FROM cpu_samples
                                  WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND comm = {comm:String}))
        GROUP BY stack_id
    ),
    definitions AS
    (
        -- IN on the sorting key reads only the sampled stacks' granules, not the whole table
        SELECT stack_id, argMax(frame_ids, last_seen) AS frame_ids
        FROM stacks
        WHERE stack_id IN (SELECT stack_id FROM samples)
        GROUP BY stack_id
    ),
    positions AS
    (
        -- one row per frame of every sampled stack; a stack without a definition becomes one pseudo-frame
        SELECT stack_id, samples, defined, frame_id, position, length(frames) AS depth
        FROM
        (
            SELECT s.stack_id AS stack_id, s.samples AS samples, notEmpty(d.frame_ids) AS defined,
                   if(defined, d.frame_ids, [toUInt64(0)]) AS frames
            FROM samples AS s
            LEFT JOIN definitions AS d ON d.stack_id = s.stack_id
        )
        ARRAY JOIN frames AS frame_id, arrayEnumerate(frames) AS position
    ),
    names AS
    (
        SELECT frame_id, argMax(function, last_seen) AS fn, argMax(binary, last_seen) AS bin, 1 AS known
        FROM frames
        WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM definitions)
        GROUP BY frame_id
    ),
    per_stack AS
    (
        -- one row per (stack, function): this is where a recurring function collapses to one count of the stack
        SELECT p.stack_id AS stack_id,
               any(p.samples) AS samples,
               multiIf(p.defined = 0, concat('[unknown stack 0x', lower(hex(p.stack_id)), ']'),
                       n.known = 1, n.fn,
                       concat('[unknown 0x', lower(hex(p.frame_id)), ']')) AS function_name,
               if(n.known = 1, n.bin, '') AS binary_name,
               max(p.position = p.depth) AS is_leaf
        FROM positions AS p
        LEFT JOIN names AS n ON n.frame_id = p.frame_id
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
