-- The sink's last planned batch per partition of its input topics, with the batch's stamp (exactly-once
-- bookkeeping; see processors/store_writer.py): the partitions whose latest state is BEFORE under one stamp were
-- planned as one batch, and a sink that takes any of them over writes that batch again whole. An empty `topics`:
-- every topic (fleetprof/rebuild_guard.py looks for unfinished batches of any sink).
SELECT
    topic,
    partition,
    argMax(min_offset, updated) AS min_offset,
    argMax(max_offset, updated) AS max_offset,
    argMax(state, updated) AS state,
    max(updated) AS stamp
FROM sink_state
WHERE empty({topics:Array(String)}) OR topic IN {topics:Array(String)}
GROUP BY topic, partition
