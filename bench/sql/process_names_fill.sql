-- bench/process_names_reload.py's fill: names {first} .. {first} + {n} - 1, each a distinct 64-digit container id
-- (every process a new container: the most names a fleet keeps), its id computed as the sink computes it (0025).
INSERT INTO process_names (proc_id, comm, container_id, identity, last_seen)
SELECT reinterpretAsUInt64(MD5(concat(comm, '\0', container_id, '\0', identity))), comm, container_id, identity, now()
FROM
(
    SELECT concat('worker-', toString(number % 300)) AS comm, leftPad(lower(hex(number)), 64, '0') AS container_id,
           leftPad(lower(hex(number % 5000)), 16, '0') AS identity
    FROM numbers({first:UInt64}, {n:UInt64})
)
