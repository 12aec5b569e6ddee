-- Evidence for a GPU alert: the top CPU stacks of the GPU's processes while its utilization was down. One row per
-- (pid, comm, root-to-leaf list of function names) with its sample count, most samples first.
-- cpu_samples.ts is the start of a reporting window of window_s seconds, so a window counts when it overlaps
-- [since, until): it starts before `until` and ends after `since`. pids is the list NVML showed on the GPU around
-- and during the drop. Same deduplication as flamegraph_cpu: argMax picks one definition per stack and frame id,
-- samples are summed, and an undefined stack or frame shows as "[unknown stack 0x…]" / "[unknown 0x…]".
-- @default window_s = 10
-- @default limit = 10
WITH
    samples AS
    (
        SELECT pid, comm, stack_id, sum(count) AS samples
        FROM cpu_samples
        WHERE node = {node:String}
          AND has({pids:Array(UInt32)}, pid)
          AND ts < {until:DateTime64(3)}
          AND ts > {since:DateTime64(3)} - toIntervalSecond({window_s:UInt32})
        GROUP BY pid, comm, stack_id
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
        SELECT pid, comm, stack_id, samples, defined, frame_id, position
        FROM
        (
            SELECT s.pid AS pid, s.comm AS comm, s.stack_id AS stack_id, s.samples AS samples,
                   notEmpty(d.frame_ids) AS defined, if(defined, d.frame_ids, [toUInt64(0)]) AS frames
            FROM samples AS s
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
    per_stack AS
    (
        SELECT p.pid AS pid, p.comm AS comm, p.stack_id AS stack_id, any(p.samples) AS samples,
               -- groupArray has no order; sorting by position restores root first, leaf last
               arrayMap(x -> x.2, arraySort(x -> x.1, groupArray((p.position,
                   multiIf(p.defined = 0, concat('[unknown stack 0x', lower(hex(p.stack_id)), ']'),
                           n.known = 1, n.fn,
                           concat('[unknown 0x', lower(hex(p.frame_id)), ']')))))) AS functions
        FROM positions AS p
        LEFT JOIN names AS n ON n.frame_id = p.frame_id
        GROUP BY pid, comm, stack_id
    )
SELECT pid, comm, functions, sum(samples) AS count
FROM per_stack
GROUP BY pid, comm, functions
ORDER BY count DESC, pid ASC, functions ASC
LIMIT {limit:UInt32}
