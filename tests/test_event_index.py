"""The event index: what the auditor's filter looks rows up by, derived from the log off the commit path.

A commit writes only the event row; the index catches up in bulk (at a checkpoint, or before a
read that is far behind) and a read always covers the rows past it from the log itself, so an
index that is behind is slower, never wrong. `verify` compares it with the log row for row.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from backends import DURABLE, Backend, backend_params, pg_execute
from conftest import Workspace
from test_store_contract import FILTER_LOG, _filled, _seqs

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay import take_checkpoint, verify
from lifecycle_fsm.store import EventFilter, MemoryEventStore, NewEvent
from lifecycle_fsm.store.open import open_store

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(params=backend_params(DURABLE))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    from backends import make_backend

    return make_backend(request.param, request, tmp_path)


def _sql(backend: Backend, sql: str) -> list[tuple[Any, ...]]:
    """One statement on a plain connection (not our code)."""
    if backend.name == "sqlite":
        with sqlite3.connect(str(backend.target), isolation_level=None) as conn:
            return conn.execute(sql).fetchall()
    assert backend.target is not None
    return pg_execute(backend.target, sql)


def _indexed(backend: Backend) -> int:
    return int(_sql(backend, "SELECT count(*) FROM event_index")[0][0])


def _event(i: int, kind: str = "Happened") -> NewEvent:
    return NewEvent("s", kind, 1, {"n": i}, f"e{i}", f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}.000000Z", "t")


def test_a_commit_writes_no_index_row_and_a_checkpoint_catches_up(backend: Backend) -> None:
    """The index fills in bulk: not on append, but in the checkpoint's own transaction."""
    store = _filled(backend.open())
    try:
        assert _indexed(backend) == 0
        store.append_checkpoint(position=7, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="r")
        assert _indexed(backend) == 7
    finally:
        store.close()


def test_every_query_is_right_with_the_index_behind_part_way(backend: Backend) -> None:
    """Rows up to the index's position come from it, the rest from the log: the same answers as the
    in-memory reference whether the index holds none, some or all of the log."""
    reference = _filled(MemoryEventStore())
    store = backend.open()
    queries: list[dict[str, Any]] = [
        {"types": ("Checked", "Handed")},
        {"actor": "ops"},
        {"since": "2026-01-01T00:00:02.500000Z", "until": "2026-01-01T00:00:04.000000Z"},
        {"types": ("Checked",), "actor": "ops", "limit": 1},
        {"since": "2026-01-01T00:00:01.000000Z", "after": 2, "before": 7},
    ]
    try:
        for i, (stream, type_name, actor, at, payload) in enumerate(FILTER_LOG):
            store.append(
                stream, store.stream_version(stream), [NewEvent(stream, type_name, 1, payload, f"f{i}", at, actor)]
            )
            if i == 3:
                store.catch_up_index()  # type: ignore[attr-defined]
        assert _indexed(backend) == 4
        for query in queries:
            assert _seqs(store, **query) == _seqs(reference, **query), query
        for at in ("2026-01-01T00:00:01.000000Z", "2026-01-01T00:00:04.000000Z", "2099-01-01T00:00:00.000000Z"):
            assert store.position_at(at) == reference.position_at(at)
    finally:
        store.close()


def test_a_read_far_behind_catches_the_index_up_before_it_answers(backend: Backend) -> None:
    """A filtered read that finds hundreds of rows past the index brings it up to date first."""
    store = backend.open()
    try:
        store.append("s", 0, [_event(i, "Odd" if i % 2 else "Even") for i in range(600)])
        assert _indexed(backend) == 0
        odd = [row[0] for batch in store.select_rows(EventFilter(types=("Odd",))) for row in batch]
        assert odd == list(range(2, 601, 2))
        assert _indexed(backend) == 600
    finally:
        store.close()


def test_an_edited_index_is_found_and_a_rebuild_restores_it(backend: Backend) -> None:
    """An index row that is not its event's columns, or a missing one, is a problem; rebuilding the
    derived indexes (what `replay --full` does) makes the index agree again."""
    store = _filled(backend.open())
    try:
        store.catch_up_index()  # type: ignore[attr-defined]
        assert store.index_problems() == []
        _sql(backend, "UPDATE event_index SET type = 'Checked' WHERE seq = 1")
        _sql(backend, "DELETE FROM event_index WHERE seq = 3")
        assert store.index_problems() == [
            "1 rows are not their event's type, actor and time",
            "1 events up to its position are missing",
        ]
        store.rebuild_stream_index(store.streams)
        assert store.index_problems() == [] and _indexed(backend) == 7
    finally:
        store.close()


def test_verify_fails_on_an_edited_index(tmp_path: Path, ws: Workspace) -> None:
    """`verify` says where the event index differs from the log, after the log itself holds."""
    store = open_store(str(tmp_path / "l.db"))
    try:
        ledger = Ledger(store, actor="t")
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        take_checkpoint(store, clock=utc_now)
        assert verify(store)["ok"]
        with sqlite3.connect(tmp_path / "l.db", isolation_level=None) as conn:
            conn.execute("UPDATE event_index SET actor = 'someone' WHERE seq = 1")
        report = verify(store)
        assert not report["ok"] and report["reason"].startswith("event index differs from the log: 1 rows")
    finally:
        store.close()


@pytest.fixture
def old_file(tmp_path: Path) -> Path:
    """A ledger file as made before the event index: the filter indexes on `events` instead."""
    path = tmp_path / "old.db"
    _filled(open_store(str(path))).close()
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("DROP TABLE event_index")
        for column in ("type", "actor", "recorded_at"):
            conn.execute(f"CREATE INDEX events_{column} ON events ({column})")
    return path


def _names(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


def test_an_older_file_is_read_as_it_is_and_given_the_index_by_a_writer(old_file: Path) -> None:
    """A read-only open answers from the old layout and changes nothing; a writer's open makes the
    event index in place of the filter indexes on `events`."""
    reference = _filled(MemoryEventStore())
    with open_store(str(old_file), create=False) as reader:
        assert _seqs(reader, types=("Checked",)) == _seqs(reference, types=("Checked",))
        assert reader.position_at("2026-01-01T00:00:04.000000Z") == 6
        assert reader.index_problems() == []
    assert "event_index" not in _names(old_file)
    with open_store(str(old_file)) as writer:
        assert {"event_index", "event_index_type"} <= _names(old_file)
        assert not {"events_type", "events_actor", "events_recorded_at"} & _names(old_file)
        assert _seqs(writer, actor="ops") == _seqs(reference, actor="ops")
        assert writer.index_problems() == []


def test_an_older_postgres_ledger_gets_the_index_from_a_writer(pg_url: str) -> None:
    """The same on PostgreSQL: opened without create, read as it is; a writer's open (a role that
    may change the schema) makes the event index and drops the filter indexes on `events`."""
    reference = _filled(MemoryEventStore())
    _filled(open_store(pg_url)).close()
    pg_execute(pg_url, "DROP TABLE event_index; CREATE INDEX events_type ON events (type)")
    exists = "SELECT to_regclass('event_index') IS NOT NULL, to_regclass('events_type') IS NOT NULL"
    with open_store(pg_url, create=False) as reader:
        assert _seqs(reader, types=("Checked",)) == _seqs(reference, types=("Checked",))
        assert reader.position_at("2026-01-01T00:00:04.000000Z") == 6
    assert pg_execute(pg_url, exists) == [(False, True)]
    with open_store(pg_url) as writer:
        assert pg_execute(pg_url, exists) == [(True, False)]
        assert _seqs(writer, actor="ops") == _seqs(reference, actor="ops")
