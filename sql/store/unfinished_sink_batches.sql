-- The sink's batches planned and not finished: partitions whose latest state is BEFORE (processors/store_writer.py).
-- A sink that takes one over writes it again whole, and each table drops the inserts it has seen before by their
-- deduplication tokens; a table rebuilt by a migration (a copy exchanged for it) has seen none, so it would keep
-- them twice.
SELECT topic, partition, min_offset, max_offset
FROM
(
    SELECT topic, partition, argMax(min_offset, updated) AS min_offset, argMax(max_offset, updated) AS max_offset,
           argMax(state, updated) AS state
    FROM sink_state
    GROUP BY topic, partition
)
WHERE state = 'BEFORE'
ORDER BY topic, partition
