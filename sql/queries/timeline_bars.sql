-- The web UI's GPU timeline: the records of timeline_records (included below), the first `limit` by start, one row
-- each with its lane (node, device, stream), process, start and end (Unix ns), what it is (KERNEL, MEMCPY, MEMSET),
-- its name as stored (a kernel's mangled name, a copy's label '[memcpy HtoD]'), the stack_id of the sample it is
-- summed into (launching stack + this record as leaf), its weight (the launches it stands for), bytes (copies and
-- sets), NVTX range path and CUDA graph ids. The caller asks one more than it shows to learn that the range holds more.
-- GPU records carry no comm yet: a process without one is named as flamegraph_ids_gpu names it, by the command the CPU
-- sampler saw it run most in the hours the range touches ('' when never sampled on CPU), so that a bar's process frame
-- is the flame graph's.
-- @default node =
-- @default pid = 0
-- @default collectives = all
-- @default what = all
-- @default nvtx_range =
-- @default limit = 100001
-- @default namespace =
-- @default pod =
-- @default job =
-- @default container =
WITH
    records AS
    (
        -- @include timeline_records
    ),
    commands AS
    (
        -- the busiest command wins, the greater name on a tie (as in flamegraph_ids_gpu)
        SELECT node, pid, argMax(comm, (samples, comm)) AS comm
        FROM
        (
            SELECT node, pid, toString(comm) AS comm, sum(count) AS samples
            FROM cpu_samples_1h
            WHERE hour >= toStartOfHour({since:DateTime64(6)}, 'UTC') AND hour < {until:DateTime64(6)}
              AND (node, pid) IN (SELECT node, pid FROM records WHERE comm = '')
            GROUP BY node, pid, comm
        )
        GROUP BY node, pid
    )
SELECT toString(r.node) AS node, r.device AS device, r.stream AS stream, r.pid AS pid,
       if(r.comm = '', c.comm, toString(r.comm)) AS comm, r.start_ns AS start_ns, r.end_ns AS end_ns,
       toString(r.activity) AS activity, toString(r.name) AS name, r.stack_id AS stack_id, r.weight AS weight,
       r.bytes AS bytes, toString(r.nvtx_range) AS nvtx_range, r.graph_id AS graph_id,
       r.graph_node_id AS graph_node_id
FROM records AS r
LEFT JOIN commands AS c ON c.node = r.node AND c.pid = r.pid
ORDER BY start_ns, node, device, stream, end_ns, name
LIMIT {limit:UInt32}
