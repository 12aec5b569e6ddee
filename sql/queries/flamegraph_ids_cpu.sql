-- The web UI's CPU flame graph as frame ids, for ranges of 100k distinct stacks: one row per sampled stack over
-- [since, until), optionally for one node / pid / comm ('' and 0 mean "all"), with its frame ids root first and its
-- CPU sample count. The same samples, filters and deduplication as flamegraph_cpu: samples are summed
-- (SummingMergeTree rows not merged yet), whole UTC hours from the hourly rollup and the ragged edges from the 10 s
-- windows (migration 0010), and each stack's newest definition comes from the stack_frames view (migration 0009); a
-- stack without a definition, or whose newest definition is empty, has frame_ids [].
-- The UI names the frames with flamegraph_names_cpu and merges stacks whose (function, binary) lists are equal
-- itself (fleetprof/webui/model.py), so it ships ~25 integers per stack instead of ~25 names and binaries as strings,
-- and ClickHouse builds no arrays of strings. Exports use flamegraph_cpu, as the CLI does.
-- @default until = now
-- @default node =
-- @default pid = 0
-- @default comm =
WITH
    -- [first_hour, end_hour): the whole UTC hours inside the range; empty (first_hour >= end_hour) for a short one
    toStartOfHour({since:DateTime} + INTERVAL 3599 SECOND, 'UTC') AS first_hour,
    toStartOfHour({until:DateTime}, 'UTC') AS end_hour,
    samples AS
    (
        SELECT stack_id, sum(count) AS value
        FROM
        (
            SELECT stack_id, count
            FROM cpu_samples_1h
            WHERE hour >= first_hour AND hour < end_hour
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String})
            UNION ALL
            SELECT stack_id, count
            FROM cpu_samples
            WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String})
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
