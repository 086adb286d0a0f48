"""The hash chain on every backend: identical hashes everywhere, and any edit behind the store's back is found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from backends import BACKEND_NAMES, Backend, make_backend
from test_store_contract import new

from lifecycle_fsm.store import EventFilter, EventStore, IntegrityError
from lifecycle_fsm.store.base import select_events, verify_chain
from lifecycle_fsm.store.chain import ChainWalk, check_rows, fold_columns


@pytest.fixture
def filled(backend: Backend) -> Iterator[EventStore]:
    """Five events over two streams: a0 a1 b0 a2 b1 (seq 1..5)."""
    store = backend.open()
    store.append("a", 0, [new("a", 0), new("a", 1)])
    store.append("b", 0, [new("b", 0)])
    store.append("a", 2, [new("a", 2)])
    store.append("b", 1, [new("b", 1)])
    yield store
    store.close()


@pytest.mark.postgres
def test_chain_is_identical_across_backends(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The same events give the same rows, hashes included, on every backend: the chain is the data's."""
    logs = []
    for name in BACKEND_NAMES:
        store = make_backend(name, request, tmp_path).open()
        store.append("a", 0, [new("a", 1), new("a", 2)])
        store.append("b", 0, [new("b", 1, x=[1, 2.5, "é", {"k": None}])])
        assert verify_chain(store).ok, name
        logs.append(list(select_events(store)))
        store.close()
    assert logs[0] == logs[1] == logs[2]


def test_verify_chain_ok_on_good_log(filled: EventStore) -> None:
    """An untouched log verifies, with its count and head."""
    report = verify_chain(filled)
    assert (report.ok, report.events, report.head, report.bad_seq) == (True, 5, filled.head(), None)


# Each hashed content column of a row, and a forged value for it (stream "c" has no version clash).
CONTENT_COLUMNS = [
    ("payload", '{"n":666}'),
    ("actor", "mallory"),
    ("recorded_at", "2030-01-01T00:00:00.000000Z"),
    ("type", "Forged"),
    ("event_id", "forged-id"),
    ("schema_version", 9),
    ("stream_id", "c"),
    ("version", 9),
]


@pytest.mark.parametrize(("column", "value"), CONTENT_COLUMNS, ids=[c for c, _ in CONTENT_COLUMNS])
def test_edited_column_breaks_chain_at_that_seq(backend: Backend, filled: EventStore, column: str, value: Any) -> None:
    """Editing any column of seq 3 (guard bypassed) makes verify_chain report seq 3."""
    backend.tamper(3, column, value)
    report = verify_chain(filled)
    assert (report.ok, report.bad_seq, report.events) == (False, 3, 5)
    assert report.reason


def test_edited_link_alone_breaks_chain_at_that_seq(backend: Backend, filled: EventStore) -> None:
    """Only `prev_hash` edited: the row's own hash still matches its content, the link does not."""
    backend.tamper(3, "prev_hash", "f" * 64)
    report = verify_chain(filled)
    assert (report.ok, report.bad_seq) == (False, 3)
    assert report.reason is not None and "prev_hash" in report.reason


def test_edited_hash_breaks_chain_at_that_seq(backend: Backend, filled: EventStore) -> None:
    """Only `hash` edited: it no longer matches the row's content."""
    backend.tamper(3, "hash", "e" * 64)
    report = verify_chain(filled)
    assert (report.ok, report.bad_seq) == (False, 3)


def test_deleted_row_breaks_chain_at_the_next_seq(backend: Backend, filled: EventStore) -> None:
    """Removing seq 3 (guard bypassed) is caught at seq 4 (a gap)."""
    backend.delete(3)
    report = verify_chain(filled)
    assert (report.ok, report.bad_seq) == (False, 4)


# --- the checked reads: whole rows re-hashed on their way to a fold -----------------------------

COLUMNS = [*CONTENT_COLUMNS, ("prev_hash", "f" * 64), ("hash", "e" * 64)]


def _fold_rows(store: EventStore) -> list[tuple[Any, ...]]:
    return [fold_columns(r) for b in store.select_rows() for r in b]


def test_select_rows_are_the_stored_rows(filled: EventStore) -> None:
    """Whole rows in `StoredEvent` field order, `after < seq < before`, the same as `select_events`."""
    everything = [attrs.astuple(e) for e in select_events(filled)]
    assert [tuple(r) for b in filled.select_rows() for r in b] == everything
    assert [tuple(r) for b in filled.select_rows(EventFilter(after=1, before=5)) for r in b] == everything[1:4]
    assert list(filled.select_rows(EventFilter(after=5))) == []


@pytest.mark.parametrize(("column", "value"), COLUMNS, ids=[c for c, _ in COLUMNS])
def test_check_rows_refuses_a_row_edited_in_any_column(
    backend: Backend, filled: EventStore, column: str, value: Any
) -> None:
    """Any hashed column of seq 3 edited: the checked read stops there, naming seq 3, before handing it on."""
    backend.tamper(3, column, value)
    handed: list[int] = []

    def read() -> None:
        for batch in check_rows(filled.select_rows()):
            handed.extend(r[0] for r in batch)

    with pytest.raises(IntegrityError, match="seq 3") as info:
        read()
    assert info.value.seq == 3 and 3 not in handed


def test_check_rows_hands_on_the_fold_columns(filled: EventStore) -> None:
    """A sound log: every row, as the fold's columns."""
    assert [tuple(r) for b in check_rows(filled.select_rows()) for r in b] == _fold_rows(filled)


@pytest.mark.parametrize(("column", "value"), COLUMNS, ids=[c for c, _ in COLUMNS])
def test_chain_walk_hands_on_no_row_past_a_break(backend: Backend, filled: EventStore, column: str, value: Any) -> None:
    """verify's one pass: the fold gets seqs 1-2 only, and the walk reports seq 3 as verify_chain does."""
    backend.tamper(3, column, value)
    walk = ChainWalk(filled.select_rows())
    handed = [r[0] for b in walk.fold_batches() for r in b]
    assert handed == [1, 2]
    report = walk.report(count=filled.count_events, head=filled.head)
    assert (report.ok, report.bad_seq, report.reason) == (False, 3, verify_chain(filled).reason)


def test_chain_walk_splits_at_each_position_and_loses_no_row(filled: EventStore) -> None:
    """fold_batches(to=P) stops at P and the next call resumes after it (checkpoints mid-batch)."""
    walk = ChainWalk(filled.select_rows())
    parts = [[tuple(r) for b in walk.fold_batches(to=to) for r in b] for to in (0, 1, 1, 3, None)]
    whole = _fold_rows(filled)
    assert parts == [[], whole[:1], [], whole[1:3], whole[3:]]
    report = walk.report(count=filled.count_events, head=filled.head)
    assert (report.ok, report.events, report.head) == (True, 5, filled.head())


def test_chain_walk_finish_finds_a_break_after_the_fold_stopped(backend: Backend, filled: EventStore) -> None:
    backend.tamper(5, "payload", '{"n":666}')
    walk = ChainWalk(filled.select_rows())
    assert [r[0] for b in walk.fold_batches(to=2) for r in b] == [1, 2]
    walk.finish()
    assert walk.report(count=filled.count_events, head=filled.head).bad_seq == 5


_GUARD_EDITS = {
    "sqlite": [
        (["DROP TRIGGER events_refuse_update"], "trigger events_refuse_update is missing"),
        (
            [
                "DROP TRIGGER events_refuse_delete",
                "CREATE TRIGGER events_refuse_delete BEFORE DELETE ON events BEGIN SELECT 1; END",
            ],
            "trigger events_refuse_delete was altered",
        ),
        (["DROP TRIGGER events_refuse_replace"], "trigger events_refuse_replace is missing"),
        (
            [
                "DROP TRIGGER events_refuse_delete",  # the same refusal, which never fires
                "CREATE TRIGGER events_refuse_delete BEFORE DELETE ON events WHEN 0 "
                "BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END",
            ],
            "trigger events_refuse_delete was altered",
        ),
        (
            [
                "DROP TRIGGER events_refuse_update",
                "CREATE TRIGGER events_refuse_update BEFORE UPDATE ON events "
                "BEGIN SELECT 1 WHERE 0 AND RAISE(ABORT, 'events are append-only: UPDATE refused'); END",
            ],
            "trigger events_refuse_update was altered",
        ),
        (["DROP INDEX events_event_id"], "unique index events_event_id is missing"),
        (
            ["CREATE TRIGGER events_stamp BEFORE INSERT ON events BEGIN SELECT 1; END"],
            "trigger events_stamp is not one of the ledger's own",
        ),
        (["DROP INDEX events_stream_version"], "unique index events_stream_version is missing"),
    ],
    "postgres": [
        (["DROP TRIGGER events_refuse_truncate ON events"], "trigger events_refuse_truncate is missing"),
        (
            ["ALTER TABLE events DISABLE TRIGGER events_refuse_update_delete"],
            "trigger events_refuse_update_delete is disabled",
        ),
        (
            [
                "CREATE OR REPLACE FUNCTION lifecycle_refuse_change() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RETURN OLD; END $$"
            ],
            "was altered",
        ),
        (
            ["ALTER TABLE events ENABLE REPLICA TRIGGER events_refuse_update_delete"],
            "trigger events_refuse_update_delete is disabled",
        ),
        (
            [
                "CREATE OR REPLACE TRIGGER events_refuse_update_delete BEFORE UPDATE OR DELETE ON events FOR EACH ROW "
                "WHEN (false) EXECUTE FUNCTION lifecycle_refuse_change()"
            ],
            "trigger events_refuse_update_delete was altered",
        ),
        (["DROP TRIGGER events_refuse_update_delete ON events"], "trigger events_refuse_update_delete is missing"),
        (
            [
                "CREATE FUNCTION rewrite_actor() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN NEW.actor := 'someone else'; RETURN NEW; END $$",
                "CREATE TRIGGER events_rewrite_actor BEFORE INSERT ON events FOR EACH ROW "
                "EXECUTE FUNCTION rewrite_actor()",
            ],
            "trigger events_rewrite_actor is not one of the ledger's own",
        ),
        (
            ["ALTER TABLE events DROP CONSTRAINT events_event_id_key, DROP CONSTRAINT events_stream_id_version_key"],
            "UNIQUE (event_id) on events is missing",
        ),
    ],
}


@pytest.mark.parametrize("edit", range(8))
def test_verify_reports_an_append_only_guard_removed_behind_its_back(backend: Backend, edit: int) -> None:
    """The chain is the proof, the triggers the fence: a file writer can take the fence down, and
    `verify` now says so (before, it answered ok and writes went on unguarded)."""
    from lifecycle_fsm.ledger import Ledger
    from lifecycle_fsm.replay import verify

    with Ledger(backend.open(), actor="t") as ledger:
        ledger.init()
        ledger.advance_window(2)
        assert ledger.store.guard_problems() == [] and verify(ledger.store)["ok"]
    if backend.name == "memory":
        return  # nothing but the class can change its list
    statements, finding = _GUARD_EDITS[backend.name][edit]
    _behind_its_back(backend, statements)
    store = backend.open()
    try:
        assert any(finding in p for p in store.guard_problems()), store.guard_problems()
        report = verify(store)
        assert not report["ok"] and report["bad_seq"] is None and finding in report["reason"]
        assert verify_chain(store).ok  # the log itself is intact: only the fence is down
    finally:
        store.close()


def _behind_its_back(backend: Backend, statements: list[str]) -> None:
    if backend.name == "sqlite":
        import sqlite3

        with sqlite3.connect(str(backend.target), isolation_level=None) as conn:
            for statement in statements:
                conn.execute(statement)
    else:
        from backends import pg_execute

        assert backend.target is not None
        for statement in statements:
            pg_execute(backend.target, statement)
