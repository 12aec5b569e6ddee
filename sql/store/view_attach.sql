-- A view detached by view_detach.sql, reading its source again.
ATTACH TABLE {view:Identifier}
