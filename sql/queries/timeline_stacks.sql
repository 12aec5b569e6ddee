-- The launching stacks of the GPU timeline's records (timeline_records, included below, for the same parameters):
-- one row per stack id with its newest definition's frame ids, root first (the record's kernel or copy is the leaf),
-- from the stack_frames view (migration 0009). A stack without a definition has no row: the UI names it
-- "[unknown stack 0x…]" as the flame graph does. Every stack of the range, also of records past the bars' limit.
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
SELECT stack_id, frame_ids FROM stack_frames WHERE stack_id IN (SELECT stack_id FROM records)
