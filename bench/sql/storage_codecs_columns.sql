-- bench/storage_codecs.py: a table's stored columns (not ALIAS ones), their codecs and compressed bytes.
SELECT name, type, compression_codec, data_compressed_bytes
FROM system.columns
WHERE database = currentDatabase() AND table = {table:String} AND default_kind != 'ALIAS'
ORDER BY position
