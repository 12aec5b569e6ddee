-- The names of the frames of timeline_stacks (same parameters): one row per defined frame id with its function,
-- binary and language (the newest definition, frame_names view, migration 0009), as flamegraph_names_gpu gives them
-- for the flame graph. A frame id without a row is named "[unknown 0x<frame id>]", as the flame graph names it.
-- @default node =
-- @default pid = 0
-- @default collectives = all
-- @default what = all
-- @default nvtx_range =
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    records AS
    (
        -- @include timeline_records
    )
SELECT frame_id, function, toString(binary) AS binary, toString(language) AS language
FROM frame_names
WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM stacks WHERE stack_id IN (SELECT stack_id FROM records))
