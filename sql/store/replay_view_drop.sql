-- The copy of a view made for one repair (fleetprof/dedup_records.py), dropped after it or before another.
DROP VIEW IF EXISTS {view:Identifier}
