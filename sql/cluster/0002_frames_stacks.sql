-- Cluster variant of migrations/0002: frames on every node, stacks sharded by stack_id.
--
-- stacks: stacks_local on each shard (ReplicatedReplacingMergeTree, one replica set per shard) and the Distributed
-- table `stacks` in front of them, sharded by stack_id. cpu_samples and gpu_kernel_samples are sharded by the same
-- key, so a stack's definition lives on the shard that holds its samples, and every duplicate definition of one id
-- lands on one shard, where ReplacingMergeTree can collapse it. stack_id is a 64-bit hash, so stack_id itself spreads
-- evenly (Distributed takes it modulo the shards' total weight); no hash of a hash is needed.
--
-- frames: NOT sharded. A frame is referenced by many stacks, on every shard, so sharding frames would make every
-- stack lookup fetch frames from other shards. Instead `frames` is one replica set spanning every node (the Keeper
-- path has no {shard}): each node holds every frame, and a frame inserted on any node reaches all of them. There is
-- no frames_local and no Distributed table: the table itself is named `frames`, so the views of 0009 and the named
-- queries read it unchanged, locally on the node that runs the query. frames holds one row per distinct (function,
-- binary, kind), far fewer rows than stacks (0009), so a full copy per node stays small.
--
-- Engines, ORDER BY, TTL and codecs as 0002 (the same reasoning holds per shard): the Replicated engines keep
-- ReplacingMergeTree's semantics, and queries still deduplicate with argMax(…, last_seen) through the 0009 views.
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

CREATE TABLE IF NOT EXISTS stacks_local ON CLUSTER '{cluster}'
(
    stack_id  UInt64        CODEC(ZSTD(1)),
    frame_ids Array(UInt64) CODEC(ZSTD(1)),
    last_seen DateTime      CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/stacks_local', '{replica}', last_seen)
ORDER BY stack_id
TTL last_seen + INTERVAL 90 DAY;

-- A Distributed table stores nothing, so its columns carry no codecs; currentDatabase() is the database the file is
-- applied in (clickhouse-client --database), and every node has its local tables there.
CREATE TABLE IF NOT EXISTS stacks ON CLUSTER '{cluster}'
(
    stack_id  UInt64,
    frame_ids Array(UInt64),
    last_seen DateTime
)
ENGINE = Distributed('{cluster}', currentDatabase(), stacks_local, stack_id);

INSERT INTO schema_migrations (version, name, applied_at) VALUES (2, '0002_frames_stacks', now());
