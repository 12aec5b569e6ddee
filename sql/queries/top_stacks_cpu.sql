-- Top CPU stacks across the fleet in [since, until), optionally for one node / comm ('' means "all"): one row per
-- distinct root-to-leaf list of function names, as folded text "root;…;leaf" (stacks that differ only in addresses
-- within the same functions merge, as in flamegraph_cpu), with
-- samples:   its CPU samples;
-- share:     samples / all samples in the range that pass the same filters (0 when there are none);
-- nodes:     how many nodes it was sampled on;
-- processes: how many (node, pid) pairs it was sampled in.
-- Same deduplication as flamegraph_cpu: samples are summed (SummingMergeTree rows not merged yet), argMax picks one
-- definition per stack and frame id (ReplacingMergeTree rows not merged yet), and a stack or frame without a
-- definition shows as "[unknown stack 0x…]" / "[unknown 0x…]". A ';' or newline inside a function name becomes ':'
-- or ' ', as in `fleetprof query flamegraph`'s folded output. Ties rank by the stack text.
-- @default until = now
-- @default node =
-- @default comm =
-- @default limit = 20
WITH
    samples AS
    (
        SELECT stack_id, node, pid, sum(count) AS samples
        FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
          AND ({node:String} = '' OR node = {node:String})
          AND ({comm:String} = '' OR comm = {comm:String})
        GROUP BY stack_id, node, pid
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
        SELECT frame_id, argMax(function, last_seen) AS fn, 1 AS known
        FROM frames
        WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM definitions)
        GROUP BY frame_id
    ),
    folded AS
    (
        SELECT p.stack_id AS stack_id,
               -- groupArray has no order; sorting by position restores root first, leaf last
               arrayStringConcat(arrayMap(x -> x.2, arraySort(x -> x.1, groupArray((p.position,
                   multiIf(p.defined = 0, concat('[unknown stack 0x', lower(hex(p.stack_id)), ']'),
                           n.known = 1, replaceAll(replaceAll(n.fn, ';', ':'), '\n', ' '),
                           concat('[unknown 0x', lower(hex(p.frame_id)), ']')))))), ';') AS stack
        FROM positions AS p
        LEFT JOIN names AS n ON n.frame_id = p.frame_id
        GROUP BY stack_id
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
