-- Generated from sql/migrations/0002_frames_stacks.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: frames on every node, stacks sharded by stack_id. frames is NOT sharded: a frame is referenced by many
-- stacks, on every shard, so sharding frames would make every stack lookup fetch frames from other shards. Instead
-- `frames` is one replica set spanning every node: each node holds every frame, and a frame inserted on any node
-- reaches all of them. There is no frames_local and no Distributed table, so the views of 0009 and the named queries
-- read `frames` unchanged, locally on the node that runs the query. frames holds one row per distinct (function,
-- binary, kind), far fewer rows than stacks (0009), so a full copy per node stays small.
CREATE TABLE IF NOT EXISTS frames ON CLUSTER '{cluster}'
(
    frame_id  UInt64                                                             CODEC(ZSTD(1)),
    function  String                                                             CODEC(ZSTD(3)),
    binary    LowCardinality(String)                                             CODEC(ZSTD(1)),
    kind      Enum8('NATIVE' = 1, 'KERNEL' = 2, 'INTERPRETED' = 3, 'UNKNOWN' = 4) CODEC(ZSTD(1)),
    last_seen DateTime                                                           CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/frames', '{shard}-{replica}', last_seen)
ORDER BY frame_id
TTL last_seen + INTERVAL 90 DAY;

-- Cluster: stacks_local on each shard, one replica set per shard, behind the Distributed table `stacks`, sharded by
-- stack_id. cpu_samples and gpu_kernel_samples are sharded by the same key, so a stack's definition lives on the shard
-- that holds its samples, and every duplicate definition of one id lands on one shard, where ReplacingMergeTree can
-- collapse it (queries still deduplicate with argMax(…, last_seen), through the 0009 views). stack_id is a 64-bit
-- hash, so it spreads evenly by itself (Distributed takes it modulo the shards' total weight); no hash of a hash is
-- needed. A Distributed table stores nothing, so its columns carry no codecs; currentDatabase() is the database the
-- file is applied in (clickhouse-client --database), and every node has its local tables there.
CREATE TABLE IF NOT EXISTS stacks_local ON CLUSTER '{cluster}'
(
    stack_id  UInt64        CODEC(ZSTD(1)),
    frame_ids Array(UInt64) CODEC(ZSTD(1)),
    last_seen DateTime      CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/stacks_local', '{replica}', last_seen)
ORDER BY stack_id
TTL last_seen + INTERVAL 90 DAY;

CREATE TABLE IF NOT EXISTS stacks ON CLUSTER '{cluster}'
(
    stack_id  UInt64,
    frame_ids Array(UInt64),
    last_seen DateTime
)
ENGINE = Distributed('{cluster}', currentDatabase(), stacks_local, stack_id);

INSERT INTO schema_migrations (version, name, applied_at) VALUES (2, '0002_frames_stacks', now());
