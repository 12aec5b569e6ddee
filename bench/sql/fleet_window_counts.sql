-- CPU samples stored per (node, window) from a window on: what the fleet bench's poller reads to see when each
-- node's window becomes complete (queryable). Summed because SummingMergeTree rows may not be merged yet.
SELECT node, toUnixTimestamp(ts) AS window_s, sum(count) AS samples
FROM cpu_samples
WHERE ts >= {since:DateTime}
GROUP BY node, ts
