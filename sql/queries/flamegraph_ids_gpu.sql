-- The web UI's GPU flame graph as frame ids, for ranges of 100k distinct stacks: one row per sampled launching stack
-- over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"), with its frame ids root first
-- (the kernel is the leaf frame) and its GPU time in ns. The same samples, filters and deduplication as
-- flamegraph_gpu: GPU time is summed (SummingMergeTree rows not merged yet), whole UTC hours from the hourly rollup
-- and the ragged edges from the 10 s windows (migration 0010), and each stack's newest definition comes from the
-- stack_frames view (migration 0009); a stack without a definition, or whose newest definition is empty, has
-- frame_ids []. The UI names the frames with flamegraph_names_gpu and merges stacks whose (function, binary) lists
-- are equal itself (fleetprof/webui/model.py), as flamegraph_ids_cpu explains. Exports use flamegraph_gpu.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
WITH
    -- [first_hour, end_hour): the whole UTC hours inside the range; empty (first_hour >= end_hour) for a short one
    toStartOfHour({since:DateTime} + INTERVAL 3599 SECOND, 'UTC') AS first_hour,
    toStartOfHour({until:DateTime}, 'UTC') AS end_hour,
    -- GPU rows carry no comm yet (launch records have none): a comm filter also takes the processes the CPU sampler
    -- saw under that comm in the range, read like the samples (whole hours from the rollup, the edges from the windows)
    comm_processes AS
    (
        SELECT node, pid FROM cpu_samples_1h WHERE hour >= first_hour AND hour < end_hour AND comm = {comm:String}
        UNION ALL
        SELECT node, pid FROM cpu_samples
        WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
          AND comm = {comm:String}
    ),
    samples AS
    (
        SELECT stack_id, sum(duration_ns) AS value
        FROM
        (
            SELECT stack_id, duration_ns
            FROM gpu_kernel_samples_1h
            WHERE hour >= first_hour AND hour < end_hour
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
            UNION ALL
            SELECT stack_id, duration_ns
            FROM gpu_kernel_samples
            WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
        )
        GROUP BY stack_id
    ),
    defined AS
    (
        -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
        SELECT stack_id, frame_ids FROM stack_frames WHERE stack_id IN (SELECT stack_id FROM samples)
    )
-- a LEFT JOIN fills a stack without a definition with [] (join_use_nulls is off)
SELECT s.stack_id AS stack_id, d.frame_ids AS frame_ids, s.value AS value
FROM samples AS s
LEFT JOIN defined AS d ON d.stack_id = s.stack_id
