"""A log emptied or shortened outside lifecycle: no new ledger starts over it, and `verify` fails.

The ledger records its first event's hash at its first append, and its state index and
checkpoints know which events it had. A log that is empty (or shorter than its state index)
while those say otherwise was damaged: writes are refused (exit 7) and `verify` says so.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from backends import pg_execute
from conftest import cli, count_events, restore_triggers, run_cli

from lifecycle_fsm.store.postgres import PostgresEventStore


def _sqlite_edit(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f'DROP TRIGGER "{name}"')
    for statement in statements:
        conn.execute(statement)
    restore_triggers(conn)  # a careful editor: the guards are back, only the history is gone
    conn.commit()
    conn.close()


def test_an_emptied_sqlite_log_takes_no_new_ledger(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    assert cli(db, "init").returncode == 0 and cli(db, "window", "2").returncode == 0
    _sqlite_edit(db, "DELETE FROM events", "DELETE FROM streams")
    refused = run_cli(db, "window", "3")
    assert refused.returncode == 7, refused.stderr
    assert "emptied outside lifecycle" in refused.stderr and "Traceback" not in refused.stderr
    assert count_events(db) == 0
    verify = cli(db, "verify")
    assert verify.returncode == 6 and "recorded as" in verify.stdout, verify.stdout


def test_a_shortened_sqlite_log_is_refused_by_its_state_index(tmp_path: Path) -> None:
    """The state index, brought forward at the checkpoint, knows the ledger's stream further than the log."""
    db = tmp_path / "ledger.db"
    assert cli(db, "init").returncode == 0 and cli(db, "window", "2").returncode == 0
    assert cli(db, "checkpoint").returncode == 0
    _sqlite_edit(db, "DELETE FROM events WHERE seq > 1")
    refused = cli(db, "window", "3")
    assert refused.returncode == 7 and "state index" in refused.stderr, refused.stderr
    assert count_events(db) == 1
    assert cli(db, "verify").returncode == 6


def test_an_emptied_log_with_an_index_but_no_recorded_first_event_is_refused(tmp_path: Path) -> None:
    """A ledger made before the first event's hash was recorded: its state index still knows."""
    db = tmp_path / "ledger.db"
    assert cli(db, "init").returncode == 0 and cli(db, "replay", "--full").returncode == 0  # the index rebuilt
    _sqlite_edit(db, "DELETE FROM meta WHERE key = 'first_event_hash'", "DELETE FROM events")
    assert cli(db, "window", "3").returncode == 7
    assert cli(db, "verify").returncode == 6


def test_a_truncated_postgres_log_takes_no_new_ledger(pg_url: str) -> None:
    assert cli(pg_url, "init").returncode == 0 and cli(pg_url, "window", "2").returncode == 0
    pg_execute(
        pg_url,
        "ALTER TABLE events DISABLE TRIGGER events_refuse_truncate; TRUNCATE events, streams; "
        "ALTER TABLE events ENABLE TRIGGER events_refuse_truncate",
    )
    refused = cli(pg_url, "window", "3")
    assert refused.returncode == 7 and "emptied outside lifecycle" in refused.stderr, refused.stderr
    assert pg_execute(pg_url, "SELECT count(*) FROM events") == [(0,)]
    verify = cli(pg_url, "verify")
    assert verify.returncode == 6 and "recorded as" in verify.stdout, verify.stdout
    with PostgresEventStore(pg_url) as store:
        assert store.history_problem() is not None


def test_a_checkpoint_of_an_empty_log_is_its_own_not_a_sign_of_lost_events(tmp_path: Path) -> None:
    from test_store_contract import new

    from lifecycle_fsm.store.sqlite import SQLiteEventStore

    with SQLiteEventStore(tmp_path / "ledger.db") as store:
        store.append_checkpoint(position=0, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
        assert store.append("a", 0, [new("a", 0)]).events[0].seq == 1
        assert store.history_problem() is None
