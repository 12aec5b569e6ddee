-- Generated from sql/migrations/0001_schema_migrations.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: every sql/cluster file creates its objects ON CLUSTER '{cluster}' and then records its version here under
-- the same version and name as the single-node file, so `fleetprof db migrate` and the processors' migrate-on-start,
-- pointed at any node, find every migration applied and run nothing of their own (their statements create
-- non-replicated tables on one node only). Apply the cluster variant of a new migration before upgrading them.
-- The table is one replica set spanning every node: the Keeper path has no {shard}, so each node holds the whole
-- table and a row inserted on one node reaches all the others. The replica name '{shard}-{replica}' is unique across
-- the cluster even where the {replica} macro repeats from shard to shard (r1, r2 on every shard).
CREATE TABLE IF NOT EXISTS schema_migrations ON CLUSTER '{cluster}'
(
    version    UInt32   CODEC(ZSTD(1)),
    name       String   CODEC(ZSTD(1)),
    applied_at DateTime CODEC(ZSTD(1))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/schema_migrations', '{shard}-{replica}',
                                      applied_at)
ORDER BY version;

INSERT INTO schema_migrations (version, name, applied_at) VALUES (1, '0001_schema_migrations', now());
