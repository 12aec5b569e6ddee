-- Where a table's parts live on disk (an embedded store's own directory): its deduplication log sits beside them.
SELECT data_paths
FROM system.tables
WHERE database = {database:String} AND name = {table:String}
