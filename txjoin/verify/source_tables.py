"""What verify reads in a source database beyond the job's tables, and how it spells a job's
types in PostgreSQL. The local stack creates these tables (``txjoin up --job``) and its
tables' DDL from the same names (``txjoin/stack/postgres.py`` imports them from here)."""

from __future__ import annotations

COMMIT_LOG = "public.txjoin_commits"
"""Uncaptured table of a source database: its transactions in commit order (``seq``)."""
CHANGE_LOG = "public.txjoin_changes"
"""Uncaptured table of a source database: every row change of its captured tables, by xid
(a trigger writes it), so verify can rebuild the source's state after each transaction."""

_PG_TYPES = {"int": "integer", "bool": "boolean", "double": "double precision"}


def pg_type(sql_type: str) -> str:
    """PostgreSQL's name for a scalar type as a job declares it (``double`` ->
    ``double precision``)."""
    return _PG_TYPES.get(sql_type, sql_type)
