-- Symbolized frames and stacks, stored once and referenced by id from the sample tables (coroot's layout).
--
-- Engine: ReplacingMergeTree(last_seen) keyed by the id. Processors re-send a definition whenever they are not sure
-- the store has it (restart, cache eviction), so duplicates are expected; merges keep the newest row, and queries
-- deduplicate with argMax(…, last_seen) so an unmerged duplicate never inflates a count. No PARTITION BY: a
-- ReplacingMergeTree only collapses rows within one partition, and an id's rows arrive days apart.
--
-- TTL: 90 days on last_seen, longer than the 30 days kept of samples, because a stack must outlive every sample that
-- references it. The writer refreshes last_seen by re-inserting a definition it keeps using, and it must do so more
-- often than every 60 days (90 minus the samples' 30): merges keep the newest last_seen, so a refreshed id survives
-- while ids nobody has sampled for 90 days disappear.
--
-- Codecs: ids are 64-bit hashes, effectively random, so only a general-purpose ZSTD finds anything (repeats across
-- stacks); function names are long, repetitive C++/Rust symbols, written once and read rarely, so ZSTD(3);
-- last_seen is not ordered (rows sort by a hash), so Delta would not help.
--
-- Cluster: frames on every node, stacks sharded by stack_id. frames is NOT sharded: a frame is referenced by many
-- stacks, on every shard, so sharding frames would make every stack lookup fetch frames from other shards. Instead
-- `frames` is one replica set spanning every node: each node holds every frame, and a frame inserted on any node
-- reaches all of them. There is no frames_local and no Distributed table, so the views of 0009 and the named queries
-- read `frames` unchanged, locally on the node that runs the query. frames holds one row per distinct (function,
-- binary, kind), far fewer rows than stacks (0009), so a full copy per node stays small.
-- @cluster on every node
CREATE TABLE IF NOT EXISTS frames
(
    frame_id  UInt64                                                             CODEC(ZSTD(1)),
    function  String                                                             CODEC(ZSTD(3)),
    binary    LowCardinality(String)                                             CODEC(ZSTD(1)),
    kind      Enum8('NATIVE' = 1, 'KERNEL' = 2, 'INTERPRETED' = 3, 'UNKNOWN' = 4) CODEC(ZSTD(1)),
    last_seen DateTime                                                           CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree(last_seen)
ORDER BY frame_id
TTL last_seen + INTERVAL 90 DAY;

-- frame_ids runs root first, leaf last: the leaf is frame_ids[-1]. Same engine, TTL and reasoning as frames.
--
-- Cluster: stacks_local on each shard, one replica set per shard, behind the Distributed table `stacks`, sharded by
-- stack_id. cpu_samples and gpu_kernel_samples are sharded by the same key, so a stack's definition lives on the shard
-- that holds its samples, and every duplicate definition of one id lands on one shard, where ReplacingMergeTree can
-- collapse it (queries still deduplicate with argMax(…, last_seen), through the 0009 views). stack_id is a 64-bit
-- hash, so it spreads evenly by itself (Distributed takes it modulo the shards' total weight); no hash of a hash is
-- needed. A Distributed table stores nothing, so its columns carry no codecs; currentDatabase() is the database the
-- file is applied in (clickhouse-client --database), and every node has its local tables there.
-- @cluster sharded by stack_id
CREATE TABLE IF NOT EXISTS stacks
(
    stack_id  UInt64        CODEC(ZSTD(1)),
    frame_ids Array(UInt64) CODEC(ZSTD(1)),
    last_seen DateTime      CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree(last_seen)
ORDER BY stack_id
TTL last_seen + INTERVAL 90 DAY;
