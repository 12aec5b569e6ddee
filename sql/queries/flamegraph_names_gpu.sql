-- The names of the frames that flamegraph_ids_gpu returns for the same parameters: one row per defined frame id
-- (its function and binary, the newest definition from the frame_names view, migration 0009) of the launching stacks
-- of the GPU kernels sampled over [since, until), optionally for one node / pid / comm ('' and 0 mean "all"). A frame
-- id without a row here has no definition: the UI names it "[unknown 0x<frame id>]" with binary ''. Frame ids come
-- from every stored definition of the sampled stacks, as flamegraph_names_cpu explains.
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
        SELECT DISTINCT stack_id
        FROM
        (
            SELECT stack_id
            FROM gpu_kernel_samples_1h
            WHERE hour >= first_hour AND hour < end_hour
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
            UNION ALL
            SELECT stack_id
            FROM gpu_kernel_samples
            WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND (ts < first_hour OR ts >= end_hour)
              AND ({node:String} = '' OR node = {node:String})
              AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
              AND ({comm:String} = '' OR comm = {comm:String} OR (node, pid) IN comm_processes)
        )
    )
SELECT frame_id, function, toString(binary) AS binary
FROM frame_names
WHERE frame_id IN (SELECT arrayJoin(frame_ids) FROM stacks WHERE stack_id IN (SELECT stack_id FROM samples))
