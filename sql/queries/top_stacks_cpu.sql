-- Top CPU stacks across the fleet in [since, until), optionally for one node / comm ('' means "all"): one row per
-- distinct root-to-leaf list of function names, as folded text "root;…;leaf" (stacks that differ only in addresses
-- within the same functions merge, as in flamegraph_cpu), with
-- samples:   its CPU samples;
-- share:     samples / all samples in the range that pass the same filters (0 when there are none);
-- nodes:     how many nodes it was sampled on;
-- processes: how many (node, pid) pairs it was sampled in.
-- Same deduplication as flamegraph_cpu: samples are summed (SummingMergeTree rows not merged yet), the stack_names view
-- (migration 0009) picks one definition per stack and frame id with argMax (ReplacingMergeTree rows not merged yet),
-- and a stack or frame without a definition shows as "[unknown stack 0x…]" / "[unknown 0x…]". A ';' or newline inside a
-- function name becomes ':' or ' ', as in `fleetprof query flamegraph`'s folded output. Ties rank by the stack text.
-- @default until = now
-- @default node =
-- @default comm =
-- @default limit = 20
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        SELECT stack_id, node, pid, sum(count) AS samples
        FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          -- @include workload_filter
          AND ({comm:String} = '' OR comm = {comm:String})
        GROUP BY stack_id, node, pid
    ),
    folded AS
    (
        SELECT s.stack_id AS stack_id,
               arrayStringConcat(arrayMap(fn -> replaceAll(replaceAll(fn, ';', ':'), '\n', ' '),
                   if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions)),
                   ';') AS stack
        FROM (SELECT DISTINCT stack_id FROM samples) AS s
        LEFT JOIN
        (
            -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
            SELECT stack_id, functions FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
        ) AS n ON n.stack_id = s.stack_id
    )
SELECT
    f.stack AS stack,
    sum(s.samples) AS samples,
    if(all_samples = 0, 0., samples / all_samples) AS share,
    uniqExact(s.node) AS nodes,
    uniqExact(s.node, s.pid) AS processes
FROM samples AS s
INNER JOIN folded AS f ON f.stack_id = s.stack_id
CROSS JOIN (SELECT sum(samples) AS all_samples FROM samples) AS t
GROUP BY stack, all_samples
ORDER BY samples DESC, stack ASC
LIMIT {limit:UInt32}
