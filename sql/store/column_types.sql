-- A table's column types, for inserts that name them instead of asking the server before every insert.
SELECT name, type
FROM system.columns
WHERE database = {database:String} AND table = {table:String}
