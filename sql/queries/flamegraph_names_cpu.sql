-- The names of the frames that flamegraph_ids_cpu returns for the same parameters: one row per defined frame id
-- (its function and binary, the newest definition from the frame_names view, migration 0009) of the stacks sampled
-- on CPU over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"), the stacks of
-- cpu_samples_by_stack (included below) as in flamegraph_ids_cpu. A frame id without a row here has no definition:
-- the UI names it "[unknown 0x<frame id>]" with binary '', as stack_frame_names does.
-- The frame ids are taken from every stored definition of the sampled stacks, straight from the stacks table: a
-- superset of those of the newest definitions (which flamegraph_ids_cpu picks with stack_frames), which only adds a
-- row for a frame that no newest definition uses, and skips stack_frames' argMax over every stack's array (a tenth
-- of a second at 100k stacks). IN on frame_names reaches the frames table's sorting key, as on stack_frames.
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
        -- @include cpu_samples_by_stack
    )
SELECT frame_id, function, toString(binary) AS binary, toString(language) AS language
FROM frame_names
WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM stacks WHERE stack_id IN (SELECT stack_id FROM samples))
