-- A view taken off its source for one insert that must not reach it (fleetprof/dedup_records.py). Not PERMANENTLY:
-- a process that dies before attaching it again finds it attached when it opens the store.
DETACH TABLE {view:Identifier}
