"""The statements the store itself runs (sql/store/<name>.sql): its migrations' bookkeeping, the sink's state, the
repair of inserts a death cut in half. Apart from fleetprof/store.py so that its helpers read them too."""

from __future__ import annotations

from fleetprof.settings import SQL_DIR

STORE_SQL_DIR = SQL_DIR / "store"


def store_sql(name: str) -> str:
    """A statement the store itself runs (sql/store/<name>.sql)."""
    return (STORE_SQL_DIR / f"{name}.sql").read_text()
