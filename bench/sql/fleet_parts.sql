-- Bytes on disk, rows and active parts per table of the bench's database.
SELECT table, sum(bytes_on_disk) AS bytes, sum(rows) AS rows, count() AS parts
FROM system.parts
WHERE database = {db:String} AND active
GROUP BY table
ORDER BY table
