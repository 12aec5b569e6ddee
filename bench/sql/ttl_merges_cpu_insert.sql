-- bench/ttl_merges.py --table cpu: one sink batch of CPU sample rows, ~500 per node (1,520 samples a window at ~3 per
-- row), every row of a node's window stamped with the window's start, 25 processes a node, stacks from a pool of 5,000.
INSERT INTO readings (ts, node, pid, comm, container_id, stack_id, count, identity)
SELECT now64(3) AS ts, concat('node-', toString(intDiv(number, 500))) AS node, toUInt32(1000 + rand() % 25) AS pid,
       ['python', 'pt_main_thread', 'nccl', 'app'][1 + pid % 4], '', cityHash64(pid, rand(1) % 5000),
       toUInt64(1 + rand(2) % 5), ''
FROM numbers({rows:UInt32})
