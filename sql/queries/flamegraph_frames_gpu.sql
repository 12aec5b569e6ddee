-- flamegraph_gpu with the binary of every frame, for the web UI's flame graph (it colors frames by binary): one
-- row per distinct root-to-leaf list of (function, binary) with its GPU time in ns, over [since, until), optionally
-- for one node / pid / comm ('' and 0 mean "all"). The same samples, filters and deduplication as flamegraph_gpu
-- (argMax picks one definition per stack and frame id, values are summed), so its counts add up to the same totals;
-- a stack whose frames have no definition gets binary ''. Exports use flamegraph_gpu itself, as the CLI does.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
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
        SELECT stack_id, argMax(frame_ids, last_seen) AS frame_ids
        FROM stacks
        WHERE stack_id IN (SELECT stack_id FROM samples)
        GROUP BY stack_id
    ),
    positions AS
    (
        SELECT stack_id, samples, defined, frame_id, position
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
        SELECT frame_id, argMax((function, binary), last_seen) AS definition, 1 AS known
        FROM frames
        WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM definitions)
        GROUP BY frame_id
    ),
    per_stack AS
    (
        SELECT p.stack_id AS stack_id,
               any(p.samples) AS samples,
               -- groupArray has no order; sorting by position restores root first, leaf last
               arraySort(x -> x.1, groupArray((p.position,
                   multiIf(p.defined = 0, concat('[unknown stack 0x', lower(hex(p.stack_id)), ']'),
                           n.known = 1, n.definition.1,
                           concat('[unknown 0x', lower(hex(p.frame_id)), ']')),
                   if(n.known = 1, toString(n.definition.2), '')))) AS path,
               arrayMap(x -> x.2, path) AS functions,
               arrayMap(x -> x.3, path) AS binaries
        FROM positions AS p
        LEFT JOIN names AS n ON n.frame_id = p.frame_id
        GROUP BY stack_id
    )
SELECT functions, binaries, sum(samples) AS count
FROM per_stack
GROUP BY functions, binaries
ORDER BY count DESC, functions ASC, binaries ASC
