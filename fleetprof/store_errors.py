"""The store's errors, each with a one-line message meant for people (re-exported by fleetprof.store)."""

from __future__ import annotations


class StoreError(RuntimeError):
    """A store failure with a one-line message meant for people."""


class UnknownQuery(StoreError):
    """No sql/queries/<name>.sql."""


class ParamError(StoreError, ValueError):
    """A named query's parameter is missing, unknown, or not of the placeholder's type."""
