-- The materialized views that read a table: each one's SELECT and the table it writes to. An embedded store's
-- sink repairs a view's insert that its death cut in half by pushing the rows through that view alone
-- (fleetprof/dedup_records.py).
SELECT name, as_select, target_table
FROM system.tables
WHERE database = {database:String} AND engine = 'MaterializedView'
  AND name IN (SELECT arrayJoin(dependencies_table) FROM system.tables
               WHERE database = {database:String} AND name = {table:String})
ORDER BY name
