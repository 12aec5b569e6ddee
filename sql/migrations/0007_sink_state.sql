-- The sink's exactly-once bookkeeping, as in ClickHouse's Kafka Connect sink: per topic partition, the offset range
-- of the batch being written and whether it is BEFORE (planned, maybe partly written) or AFTER (durable) the insert.
--
-- Engine: ReplacingMergeTree(updated) ORDER BY (topic, partition): only the latest state per partition matters, and
-- readers take argMax(…, updated), so rows not merged yet are harmless. updated is DateTime64(6) because BEFORE and
-- AFTER of one batch can be written within the same millisecond. No deduplication window: consecutive states of a
-- partition may be byte-identical apart from updated, and each must land. No TTL: one row per partition after merges.
-- Codecs: ZSTD(1) throughout; the table is tiny, the codecs are explicit for uniformity.
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
