-- The sink's exactly-once bookkeeping, as in ClickHouse's Kafka Connect sink: per topic partition, the offset range
-- of the batch being written and whether it is BEFORE (planned, maybe partly written) or AFTER (durable) the insert.
--
-- Engine: ReplacingMergeTree(updated) ORDER BY (topic, partition): only the latest state per partition matters, and
-- readers take argMax(…, updated), so rows not merged yet are harmless. updated is DateTime64(6) because BEFORE and
-- AFTER of one batch can be written within the same millisecond. No deduplication window: consecutive states of a
-- partition may be byte-identical apart from updated, and each must land. No TTL: one row per partition after merges.
-- Codecs: ZSTD(1) throughout; the table is tiny, the codecs are explicit for uniformity.
--
-- Cluster: one replica set spanning every node, like frames (0002): a few rows per topic partition, read whenever a
-- sink is assigned partitions, so every node holds the table whole and the read never leaves the node the sink talks
-- to. The sink inserts these rows without a deduplication token and with deduplication switched off
-- (fleetprof/store.py), so the Replicated engine's block deduplication never drops a state row either.
-- Consistency: a sink that takes over a partition (a restart, a rebalance to another instance) resumes from the newest
-- row of that partition here, and a replica that has not yet received it would send it back to an older range, whose
-- batches may then split differently and escape the deduplication tokens. So the sink's ClickHouse user writes with
-- insert_quorum = 'auto' and reads with select_sequential_consistency = 1 (the fleetprof_sink profile), or every sink
-- instance talks to the same node.
-- @cluster on every node
CREATE TABLE IF NOT EXISTS sink_state
(
    topic      LowCardinality(String)           CODEC(ZSTD(1)),
    partition  UInt32                           CODEC(ZSTD(1)),
    min_offset Int64                            CODEC(ZSTD(1)),
    max_offset Int64                            CODEC(ZSTD(1)),
    state      Enum8('BEFORE' = 1, 'AFTER' = 2) CODEC(ZSTD(1)),
    updated    DateTime64(6)                    CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree(updated)
ORDER BY (topic, partition);
