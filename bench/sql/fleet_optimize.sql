-- Merge every part of a table into one per partition, so bytes on disk are what the data settles at.
OPTIMIZE TABLE {table:Identifier} FINAL
