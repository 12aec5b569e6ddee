-- bench/ttl_merges.py --table cpu, at the end of a run: the flame graph's scan of cpu_samples (samples per stack over
-- a time range, optionally one node's), summed down to one row so the engine's work is timed, not the transfer.
SELECT count() AS stacks, sum(samples) AS samples
FROM
(
    SELECT stack_id, sum(count) AS samples
    FROM readings
    WHERE ts >= now64(3) - toIntervalMillisecond({range_ms:UInt64}) AND ({node:String} = '' OR node = {node:String})
    GROUP BY stack_id
)
