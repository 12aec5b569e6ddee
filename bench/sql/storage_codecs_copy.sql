-- bench/storage_codecs.py: an empty copy of a table (its columns, codecs, engine, key). The names are the bench's
-- own table names, formatted in: CREATE TABLE ... AS takes no bound identifiers.
CREATE TABLE {copy} AS {table}
