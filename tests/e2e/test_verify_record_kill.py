"""verify's record survives a kill: in the middle of an append, and between the append and
the slot's advance (``txjoin.verify.history``; the crash points ``verify_append`` and
``verify_appended``, ``txjoin.crashpoints``), on a real PostgreSQL's logical decoding.

Each kill is a process of its own reading the record, killed by the crash-point hook
(SIGKILL, as kill -9), which records where it fired. The next read must hold every
transaction once and whole: the one cut off in the middle of the append is read again
from the slot, whose advance follows a whole append.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from tests.fixtures.postgres import new_database
from txjoin.crashpoints import CRASH_ENV, RECORD_ENV, VERIFY_APPEND, VERIFY_APPENDED, fired
from txjoin.verify.history import (
    SLOT,
    drop_record,
    parse_record,
    parsed_path,
    read_record,
    record_path,
    start_record,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TABLE = "public.items"


@pytest.fixture
def dsn(pg_server: str) -> str:
    """A database of its own on the session's PostgreSQL server (tests/conftest.py)."""
    return new_database(pg_server, "verify_record_kill")


def _transaction(dsn: str, *statements: str) -> int:
    """Run ``statements`` as one transaction; its xid."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        cur.execute("SELECT txid_current()")
        (xid,) = cur.fetchone()
    conn.close()
    return int(xid) & 0xFFFFFFFF  # the 32-bit xid test_decoding prints


def _read_killed_at(dsn: str, directory: Path, point: str) -> list[tuple[str, int | None]]:
    """Read the record in a process of its own that the hook kills at ``point``; where the
    hook fired."""
    fired_file = directory / f"{point}.fired"
    code = ("import sys; from pathlib import Path; from txjoin.verify.history import "
            "read_record; read_record(sys.argv[1], Path(sys.argv[2]))")
    env = {**os.environ, CRASH_ENV: point, RECORD_ENV: str(fired_file)}
    done = subprocess.run([sys.executable, "-c", code, dsn, str(directory)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, start_new_session=True,
                          check=False)
    assert done.returncode == -9, (done.returncode, done.stderr[-2000:])
    return fired(fired_file)


def _pending(dsn: str) -> int:
    """Lines the slot still holds (not advanced past)."""
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
                    "'skip-empty-xacts', '1')", (SLOT,))
        (count,) = cur.fetchone()
    conn.close()
    return int(count)


def test_a_verify_killed_inside_an_append_or_before_the_slot_advances_keeps_each_transaction_once(
        dsn: str, tmp_path: Path) -> None:
    _transaction(dsn, f"CREATE TABLE {TABLE} (id int PRIMARY KEY, v text)",
                 f"INSERT INTO {TABLE} VALUES (1, 'a'), (2, 'b')")
    start_record(dsn, tmp_path, [TABLE])
    path = record_path(tmp_path, dsn)
    try:
        # (xid, its row changes): a large transaction first, the one the kill cuts
        expected = [(_transaction(dsn, *[f"INSERT INTO {TABLE} VALUES ({i}, 'x')"
                                         for i in range(10, 60)]), 50),
                    (_transaction(dsn, f"UPDATE {TABLE} SET v = 'c' WHERE id = 1",
                                  f"DELETE FROM {TABLE} WHERE id = 2"), 2)]

        # Killed in the middle of the append (half of its 56 lines written): the first
        # transaction is in the record with its BEGIN and 27 of its changes, and the slot
        # was not advanced.
        assert _read_killed_at(dsn, tmp_path, VERIFY_APPEND) == [(VERIFY_APPEND, None)]
        entries = [json.loads(line) for line in path.read_text().splitlines()[1:]]
        assert entries and entries[0]["data"].startswith("BEGIN")
        assert {e["xid"] for e in entries} == {expected[0][0]}
        assert not any(e["data"].startswith("COMMIT") for e in entries), entries[-1]
        assert len(entries) == (52 + 4) // 2
        assert _pending(dsn) > 0

        expected.append((_transaction(dsn, f"INSERT INTO {TABLE} VALUES (3, 'd')"), 1))
        # Killed after a whole append, before the slot's advance: the record holds all three
        # (the first one whole, read again from the slot), the slot still holds them.
        assert _read_killed_at(dsn, tmp_path, VERIFY_APPENDED) == [(VERIFY_APPENDED, None)]
        lines = path.read_text().splitlines()[1:]
        commits = [json.loads(line)["xid"] for line in lines if '"data": "COMMIT' in line]
        assert commits == [xid for xid, _ in expected]
        assert _pending(dsn) > 0

        # The next verify skips what the record holds whole and advances the slot.
        record = read_record(dsn, tmp_path)
        assert record is not None
        assert [(xid, len(changes)) for xid, changes in record.transactions] == expected
        assert [c.op for c in record.transactions[1][1]] == ["UPDATE", "DELETE"]
        assert path.read_text().splitlines()[1:] == lines  # nothing appended twice
        assert _pending(dsn) == 0
        assert sorted(r["id"] for r in record.snapshot[TABLE]) == [1, 2]

        # With the record's parse kept beside it (by the read above), killed in the middle
        # of the next append: the next read parses the lines after the kept parse, the cut
        # transaction read again whole, and reads as a parse of the whole file.
        assert parsed_path(path).exists()
        expected.append((_transaction(dsn, *[f"INSERT INTO {TABLE} VALUES ({i}, 'y')"
                                             for i in range(60, 80)]), 20))
        (tmp_path / f"{VERIFY_APPEND}.fired").unlink()
        assert _read_killed_at(dsn, tmp_path, VERIFY_APPEND) == [(VERIFY_APPEND, None)]
        record = read_record(dsn, tmp_path)
        assert record is not None
        assert [(xid, len(changes)) for xid, changes in record.transactions] == expected
        parsed_path(path).unlink()
        assert parse_record(path) == record
    finally:
        drop_record(dsn, tmp_path)
