-- The MergeTree-family tables of the bench's database: those OPTIMIZE ... FINAL applies to.
SELECT name
FROM system.tables
WHERE database = {db:String} AND engine LIKE '%MergeTree%'
ORDER BY name
