-- The web UI's CPU flame graph as frame ids, for ranges of 100k distinct stacks: one row per process and sampled
-- stack over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"), with the stack's frame ids
-- root first, its CPU sample count in that process, and the process (node, pid, comm): the UI roots each process's
-- stacks at a frame of its own, as the per-process exports do (flamegraph_processes_cpu). The same samples, filters
-- and deduplication as flamegraph_processes_cpu: the samples per process and stack from cpu_samples_by_process_stack
-- (included below), and each stack's newest definition from the stack_frames view (migration 0009); a stack without
-- a definition, or whose newest definition is empty, has frame_ids [].
-- The UI names the frames with flamegraph_names_cpu and merges stacks whose process and (function, binary) lists are
-- equal itself (fleetprof/webui/model.py), so it ships ~25 integers per stack instead of ~25 names and binaries as
-- strings, and ClickHouse builds no arrays of strings. Exports use flamegraph_processes_cpu, as the CLI does.
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
    defined AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, frame_ids FROM stack_frames WHERE stack_id IN (SELECT stack_id FROM samples)
    )
-- a LEFT JOIN fills a stack without a definition with [] (join_use_nulls is off)
SELECT s.stack_id AS stack_id, d.frame_ids AS frame_ids, s.count AS value,
       toString(s.node) AS node, s.pid AS pid, toString(s.comm) AS comm
FROM samples AS s
LEFT JOIN defined AS d ON d.stack_id = s.stack_id
