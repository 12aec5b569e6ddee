-- bench/ttl_merges.py --table cpu, the layouts that price the process strings (daily_named, daily_process_ids): one
-- sink batch of CPU sample rows as bench/sql/ttl_merges_cpu_insert.sql, each process with a container id (64 hex
-- digits) and a workload identity of its own, as a Kubernetes node's processes have, instead of empty strings.
INSERT INTO readings (ts, node, pid, comm, container_id, stack_id, count, identity)
SELECT now64(3) AS ts, concat('node-', toString(intDiv(number, 500))) AS node, toUInt32(1000 + rand() % 25) AS pid,
       ['python', 'pt_main_thread', 'nccl', 'app'][1 + pid % 4],
       lower(concat(hex(cityHash64(node, pid, 1)), hex(cityHash64(node, pid, 2)), hex(cityHash64(node, pid, 3)),
                    hex(cityHash64(node, pid, 4)))),
       cityHash64(pid, rand(1) % 5000), toUInt64(1 + rand(2) % 5),
       concat('k8s/team-', toString(pid % 3), '/train-', lower(hex(cityHash64(node, pid % 5))), '/worker')
FROM numbers({rows:UInt32})
