-- bench/storage_codecs.py: a column of the copy under a candidate codec. The copy's and the column's names and the
-- codec are the bench's own text (its tables, their columns, its candidates or --codec), formatted in: MODIFY COLUMN
-- takes no bound identifiers or codecs.
ALTER TABLE {copy} MODIFY COLUMN {column} CODEC({codec})
