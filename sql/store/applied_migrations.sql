-- Versions of the migrations already applied to this database.
SELECT DISTINCT version
FROM schema_migrations
ORDER BY version
