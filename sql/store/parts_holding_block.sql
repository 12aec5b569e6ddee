-- Active parts of a table that hold a block number of a partition: the part an insert made, or a merge of it.
SELECT count()
FROM system.parts
WHERE database = {database:String} AND table = {table:String} AND active
  AND partition_id = {partition:String} AND min_block_number <= {block:Int64} AND max_block_number >= {block:Int64}
