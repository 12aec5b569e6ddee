-- Top functions by CPU samples in [since, until), optionally for one node / pid / comm ('' and 0 mean "all").
-- self:  samples whose leaf frame is the function (time spent in the function itself);
-- total: samples whose stack contains the function at least once (time in it and below it); a function that
--        recurs within one stack counts that stack once.
-- Samples are SummingMergeTree rows that may not be merged yet, so they are summed. Stacks and frames are
-- ReplacingMergeTree rows that may not be merged yet: the stack_frame_names view (migration 0009) picks one
-- definition per stack and frame id with argMax and gives one row per frame, named "[unknown 0x…]" when the frame
-- has no definition. A sampled stack without a definition has no rows there and shows as one frame
-- "[unknown stack 0x…]" rather than vanishing from the counts.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default limit = 20
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        SELECT stack_id, sum(count) AS samples
        FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
          AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
          AND ({comm:String} = '' OR comm = {comm:String})
        GROUP BY stack_id
    ),
    per_stack AS
    (
        -- one row per (stack, function): this is where a recurring function collapses to one count of the stack
        SELECT s.stack_id AS stack_id,
               any(s.samples) AS samples,
               if(f.position = 0, concat('[unknown stack 0x', lower(hex(s.stack_id)), ']'), f.function)
                   AS function_name,
               f.binary AS binary_name,
               max(f.position = f.depth) AS is_leaf
        FROM
        (
            -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
            SELECT stack_id, position, depth, function, binary
            FROM stack_frame_names
            WHERE stack_id IN (SELECT stack_id FROM samples)
        ) AS f
        -- the frames are the big side, so they probe a hash table of the samples rather than fill one; a sampled
        -- stack without a definition comes through with position 0
        RIGHT JOIN samples AS s ON f.stack_id = s.stack_id
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
