-- Which migrations have run in this database. migrate() reads it before anything else, so it is created first.
-- ReplacingMergeTree(applied_at) keyed by version: two processes racing through the same (re-runnable) migration
-- against a ClickHouse server each record it, and the duplicate collapses into one row. A few rows ever: no TTL,
-- and ZSTD(1) everywhere because the codec hardly matters here beyond being explicit.
--
-- Cluster: every sql/cluster file creates its objects ON CLUSTER '{cluster}' and then records its version here under
-- the same version and name as the single-node file, so `fleetprof db migrate` and the processors' migrate-on-start,
-- pointed at any node, find every migration applied and run nothing of their own (their statements create
-- non-replicated tables on one node only). Apply the cluster variant of a new migration before upgrading them.
-- The table is one replica set spanning every node: the Keeper path has no {shard}, so each node holds the whole
-- table and a row inserted on one node reaches all the others. The replica name '{shard}-{replica}' is unique across
-- the cluster even where the {replica} macro repeats from shard to shard (r1, r2 on every shard).
-- @cluster on every node
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version    UInt32   CODEC(ZSTD(1)),
    name       String   CODEC(ZSTD(1)),
    applied_at DateTime CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree(applied_at)
ORDER BY version;
