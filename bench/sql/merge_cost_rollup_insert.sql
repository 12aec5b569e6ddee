-- bench/merge_cost.py --keys: one window's cpu_samples rows into the rollup's copy, one part, as the view (0018)
-- passes them on.
INSERT INTO rollup_variant (hour, node, pid, comm, container_id, stack_id, count, identity)
SELECT toStartOfHour(ts, 'UTC'), node, pid, comm, container_id, stack_id, count, identity
FROM cpu_samples
WHERE ts = {ts:DateTime}
SETTINGS max_threads = 1, optimize_on_insert = 0
