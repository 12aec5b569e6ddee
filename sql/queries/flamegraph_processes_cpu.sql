-- The CPU flame graph per process, for the per-process flame graph exports and pprof: over [since, until),
-- optionally for one node / pid / comm ('' and 0 mean "all"), one row per (node, pid, comm, root-to-leaf list of
-- function names and their binaries) with its sample count, and the sampling frequency of the node's agent.
-- The samples per process and stack come from cpu_samples_by_process_stack (included below), the names from the
-- stack_names view (migration 0009) with flamegraph_cpu's deduplication and "[unknown 0x…]" / "[unknown stack 0x…]"
-- naming (an unknown stack's one frame has binary ''). flamegraph_cpu is this summed over the processes and binaries.
-- frequency_hz is the agent's sampling frequency that most of the node's windows in the range recorded (migration
-- 0012, profile_windows); 0 when none did (data stored before the frequency was kept): pprof's period and CPU time.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    samples AS
    (
        -- @include cpu_samples_by_process_stack
    ),
    named AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, functions, binaries FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
    ),
    rates AS
    (
        -- windows are counted once however often a ReplacingMergeTree row is still duplicated; ties go to the higher
        SELECT node, argMax(frequency_hz, (windows, frequency_hz)) AS frequency_hz
        FROM
        (
            SELECT node, frequency_hz, uniqExact(ts) AS windows
            FROM profile_windows
            WHERE kind = 'cpu' AND frequency_hz > 0 AND ts >= {since:DateTime} AND ts < {until:DateTime}
              AND ({node:String} = '' OR node = {node:String})
            GROUP BY node, frequency_hz
        )
        GROUP BY node
    )
SELECT toString(s.node) AS node, s.pid AS pid, toString(s.comm) AS comm,
       if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')], n.functions) AS functions,
       if(empty(n.functions), [''], n.binaries) AS binaries,
       r.frequency_hz AS frequency_hz,
       sum(s.count) AS count
FROM samples AS s
LEFT JOIN named AS n ON n.stack_id = s.stack_id
LEFT JOIN rates AS r ON r.node = s.node
GROUP BY node, pid, comm, functions, binaries, frequency_hz
ORDER BY count DESC, node ASC, pid ASC, comm ASC, functions ASC, binaries ASC
