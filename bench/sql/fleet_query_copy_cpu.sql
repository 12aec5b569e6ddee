-- The query bench's fill: the CPU sample rows of [from, to) again, `shift` seconds later (negative: earlier), each
-- window's rows unchanged (every key column; the process id stands for its strings, 0025). The insert also feeds the
-- hourly rollup's materialized view, as the sink's inserts do.
INSERT INTO cpu_samples (ts, node, pid, proc_id, stack_id, count)
SELECT ts + toIntervalSecond({shift:Int64}), node, pid, proc_id, stack_id, count
FROM cpu_samples
WHERE ts >= {from:DateTime} AND ts < {to:DateTime}
