"""The names `Store.migrate()` returns for a store migrated up to just before a version: that one and every later
one, read from sql/migrations (a later migration joins them without editing each test that migrates a store)."""

from __future__ import annotations

from fleetprof.store import migration_files


def migrations_from(version: int) -> list[str]:
    """The names of migration `version` and of every later one, in order."""
    names = [name for v, name, _ in migration_files() if v >= version]
    assert names and names[0].startswith(f"{version:04d}_"), f"no migration {version}"
    return names
