-- The query bench's fill: the CPU sample rows of [from, to) again, `shift` seconds later (negative: earlier), each
-- window's rows unchanged (every key column, the workload identity too). The insert also feeds the hourly rollup's
-- materialized view, as the sink's inserts do.
INSERT INTO cpu_samples (ts, node, pid, comm, container_id, stack_id, identity, count)
SELECT ts + toIntervalSecond({shift:Int64}), node, pid, comm, container_id, stack_id, identity, count
FROM cpu_samples
WHERE ts >= {from:DateTime} AND ts < {to:DateTime}
