-- Evidence for a GPU alert: the top CPU stacks of the GPU's processes while its utilization was down. One row per
-- (pid, comm, root-to-leaf list of function names) with its sample count, most samples first.
-- cpu_samples.ts is the start of a reporting window of window_s seconds, so a window counts when it overlaps
-- [since, until): it starts before `until` and ends after `since`. pids is the list NVML showed on the GPU around
-- and during the drop. Same deduplication as flamegraph_cpu: samples are summed, the stack_names view (migration
-- 0009) picks one definition per stack and frame id with argMax, and an undefined stack or frame shows as
-- "[unknown stack 0x…]" / "[unknown 0x…]".
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
    named AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, functions FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
    )
SELECT s.pid AS pid, s.comm AS comm,
       if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions) AS functions,
       sum(s.samples) AS count
FROM samples AS s
LEFT JOIN named AS n ON n.stack_id = s.stack_id
GROUP BY pid, comm, functions
ORDER BY count DESC, pid ASC, functions ASC
LIMIT {limit:UInt32}
