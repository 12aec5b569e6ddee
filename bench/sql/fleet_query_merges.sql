-- Merges still running in the bench's database: the query bench waits for none after its fill.
SELECT count() FROM system.merges WHERE database = {db:String}
