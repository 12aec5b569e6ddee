-- The GPU timeline's records: every sampled kernel, copy and set (gpu_timeline, migration 0014) that overlaps
-- [since_ns, until_ns) (Unix ns), optionally of one node / pid ('' and 0 mean "all"). The timeline queries include it
-- (`-- @include timeline_records`), so they read one set of records. since / until are the same range in whole
-- seconds (the start rounded down, the end up): they prune the daily partitions by ts, with 10 minutes to spare
-- either side, since ts is the record's sample window, not its start. The sorting key (node, device, stream,
-- start_ns) narrows a node's read to the range's granules.
-- @default node =
-- @default pid = 0
SELECT *
FROM gpu_timeline
WHERE ts >= {since:DateTime} - INTERVAL 10 MINUTE AND ts < {until:DateTime} + INTERVAL 10 MINUTE
  AND start_ns < {until_ns:UInt64} AND end_ns > {since_ns:UInt64}
  AND ({node:String} = '' OR node = {node:String})
  AND ({pid:UInt32} = 0 OR pid = {pid:UInt32})
