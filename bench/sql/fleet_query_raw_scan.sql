-- The query bench's peer: the flame graph's aggregation alone, straight from the 10 s windows of cpu_samples over
-- [since, until) (one node, or all for ''), with no names and no result shipped: what any query answering from the
-- window table must at least read and sum. Summed, because SummingMergeTree rows may not be merged yet.
SELECT count() AS stacks, sum(samples) AS samples
FROM
(
    SELECT stack_id, sum(count) AS samples
    FROM cpu_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime} AND ({node:String} = '' OR node = {node:String})
    GROUP BY stack_id
)
