-- Whether this database has the schema_migrations table yet (a fresh database has not run 0001).
SELECT count() AS present
FROM system.tables
WHERE database = currentDatabase() AND name = 'schema_migrations'
