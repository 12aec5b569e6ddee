-- The sink's last planned batch per partition of one topic (exactly-once bookkeeping; see processors/store_writer.py).
SELECT
    partition,
    argMax(min_offset, updated) AS min_offset,
    argMax(max_offset, updated) AS max_offset,
    argMax(state, updated) AS state
FROM sink_state
WHERE topic = {topic:String}
GROUP BY partition
