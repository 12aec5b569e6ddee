-- A copy of a materialized view reading the replay table instead of its source: its SELECT (system.tables.as_select,
-- the source's name swapped for the replay table's) follows this line.
CREATE MATERIALIZED VIEW {view:Identifier} TO {target:Identifier} AS
