-- A table of `source`'s columns that keeps nothing: what is inserted into it only reaches the views reading it.
CREATE TABLE {replay:Identifier} ENGINE = Null AS SELECT * FROM {source:Identifier} LIMIT 0
