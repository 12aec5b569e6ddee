-- bench/storage_codecs.py: the table's rows into its copy.
INSERT INTO {copy:Identifier} SELECT * FROM {table:Identifier}
