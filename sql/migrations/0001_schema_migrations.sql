-- Which migrations have run in this database. migrate() reads it before anything else, so it is created first.
-- ReplacingMergeTree(applied_at) keyed by version: two processes racing through the same (re-runnable) migration
-- against a ClickHouse server each record it, and the duplicate collapses into one row. A few rows ever: no TTL,
-- and ZSTD(1) everywhere because the codec hardly matters here beyond being explicit.
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version    UInt32   CODEC(ZSTD(1)),
    name       String   CODEC(ZSTD(1)),
    applied_at DateTime CODEC(ZSTD(1))
)
ENGINE = ReplacingMergeTree(applied_at)
ORDER BY version;
