-- Whether this database has the table yet (a store not migrated that far has not).
SELECT count() AS present
FROM system.tables
WHERE database = currentDatabase() AND name = {name:String}
