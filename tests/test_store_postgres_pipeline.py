"""The pipelined one-round-trip append on PostgreSQL (store/postgres_pipeline.py).

The lock, the insert and the commit go as separate statements in one round trip: these
tests pin that the insert still reads the head after the lock was granted, that values
arrive exactly as text parameters, that a statement whose preparation failed is prepared
again, and that an interrupted round trip leaves no half-used session behind.
"""

from __future__ import annotations

import enum
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from backends import pg_execute
from test_store_contract import new

from lifecycle_fsm.store import InputError, StoreError
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.records import NewEvent

pytestmark = pytest.mark.postgres


@pytest.fixture(params=["pipeline", "one message"])
def store(pg_url: str, request: pytest.FixtureRequest) -> Iterator[PostgresEventStore]:
    """A store sending its appends pipelined, or (as with a libpq older than 14) as one simple-query message."""
    with PostgresEventStore(pg_url, synchronous="NORMAL") as s:
        s.session.pipeline.supported = request.param == "pipeline"
        s.append("a", 0, [new("a", 0), new("a", 1)])
        s.append("b", 0, [new("b", 0)])
        yield s


def test_an_append_that_waited_for_the_lock_chains_to_what_the_holder_committed(
    store: PostgresEventStore, pg_url: str
) -> None:
    """Another writer appends and holds the lock; ours waits, then lands right after that row in its one trip.

    The insert is a statement of its own after the lock statement, so its snapshot is taken
    once the lock is granted (read committed) and it sees the holder's row: in one statement
    with the lock it would read the head from before the wait and collide on seq."""
    appended = threading.Event()
    supported = store.session.pipeline.supported

    def hold() -> None:  # its own store: a store is used by the thread that opened it (store/threads.py)
        with PostgresEventStore(pg_url, synchronous="NORMAL") as other:
            other.session.pipeline.supported = supported
            with other.transaction() as tx:
                tx.append("b", 1, [new("b", 1)])
                appended.set()
                time.sleep(0.5)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert appended.wait(30)
        result = store.append("a", 2, [new("a", 2)])  # the store's guess (seq 3) is stale by then
    finally:
        holder.join()
    held = store.event_at(4)
    assert held is not None and held.stream_id == "b"
    assert (result.events[0].seq, result.events[0].prev_hash) == (5, held.hash)
    assert store.verify_chain().ok


def test_a_statement_whose_preparation_failed_is_prepared_again(store: PostgresEventStore, pg_url: str) -> None:
    """With the events table gone the append fails (StoreError), naming nothing prepared; once it is
    back, the next append prepares its statements again instead of executing a name that does not exist."""
    pg_execute(pg_url, "ALTER TABLE events RENAME TO events_away")
    with pytest.raises(StoreError, match="not a ledger"):
        store.append("a", 2, [new("a", 2)], fresh_ids=True)
    pg_execute(pg_url, "ALTER TABLE events_away RENAME TO events")
    for n in (2, 3):
        assert store.append("a", n, [new("a", n)], fresh_ids=True).events[0].seq == n + 2
    assert store.verify_chain().ok


def test_values_go_as_text_parameters_exactly(store: PostgresEventStore) -> None:
    """What the pipeline sends for each kind of value; a NUL is refused (text input would cut it there)."""
    pipeline = store.session.pipeline
    tricky = "q\"uote \\back\\\"slash, {brace} 'single' é"
    assert pipeline.param("é'x") == "é'x".encode()
    assert (pipeline.param(-7), pipeline.param(None)) == (b"-7", None)
    assert pipeline.param(["a", tricky, None, 3]) == (
        '{"a","q\\"uote \\\\back\\\\\\"slash, {brace} \'single\' é",NULL,3}'.encode()
    )
    row = store.session.conn.execute("SELECT %s::text[]", (["a", tricky],)).fetchone()
    assert row is not None and row[0] == ["a", tricky]  # what PostgreSQL reads from that literal
    for bad in ("a\0b", ["a\0b"]):
        with pytest.raises(InputError, match="NUL"):
            pipeline.param(bad)
    for unsendable in (1.5, True, b"x"):
        with pytest.raises(InputError, match="cannot send"):
            pipeline.param(unsendable)


class _Key(enum.StrEnum):
    ID = "key-1"


class _Count(enum.IntEnum):
    TWO = 2


def test_str_and_int_subclasses_go_as_their_values(store: PostgresEventStore) -> None:
    """An id or actor given as a StrEnum (a `str` subclass) is stored as its text, as psycopg would send it;
    an IntEnum as its digits. Not a raw TypeError from the store."""
    pipeline = store.session.pipeline
    assert (pipeline.param(_Key.ID), pipeline.param(_Count.TWO)) == (b"key-1", b"2")
    assert pipeline.param([_Key.ID, _Count.TWO]) == b'{"key-1",2}'
    event = new("a", 2, event_id=_Key.ID)
    event = NewEvent(event.stream_id, event.type, event.schema_version, event.payload, event.event_id,
                     event.recorded_at, _Key.ID)  # fmt: skip
    stored = store.append("a", 2, [event]).events[0]
    back = store.event_at(stored.seq)
    assert back is not None and (back.event_id, back.actor) == ("key-1", "key-1")
    assert type(back.event_id) is str and back.hash == stored.hash
    assert store.verify_chain().ok


def test_a_real_interrupt_while_waiting_leaves_the_session_able_to_append(
    store: PostgresEventStore, pg_url: str
) -> None:
    """Ctrl-C while a new session's first append waits for the ledger's lock (another session holds it):
    psycopg cancels the query and reads the answers, so the session stays open, but whether the server
    prepared the statement sent with it is unknown; it is prepared again under a new name, and the next
    append after the lock is free goes through."""
    holder = psycopg.connect(pg_url)
    holder.execute(store.session.lock_sql)

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    with PostgresEventStore(pg_url, synchronous="NORMAL") as fresh:
        fresh.session.pipeline.supported = store.session.pipeline.supported
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(KeyboardInterrupt):
                fresh.append("a", 2, [new("a", 2)])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            holder.rollback()
            holder.close()
        assert not fresh.session.conn.closed
        for n in (2, 3):
            assert fresh.append("a", n, [new("a", n)]).events[0].seq == n + 2
        assert fresh.count_events() == 5 and fresh.verify_chain().ok


def test_an_interrupted_round_trip_closes_the_session_and_the_next_call_opens_another(
    store: PostgresEventStore,
) -> None:
    """Interrupted while waiting for the answer (Ctrl-C), the session is closed rather than left in
    pipeline mode with answers unread (the server rolls back what it had not committed); the next call
    opens a new session (store/postgres_schema.py, `PgSession.recover`)."""
    conn = store.session.conn

    def interrupted(gen: Any, *args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    conn.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        store.append("a", 2, [new("a", 2)])
    assert conn.closed
    # Sent whole before the wait (the Sync with it): the server committed it, though the caller saw
    # only the interrupt. The same append repeated (its event id) answers as a retry, appends nothing.
    retried = store.append("a", 2, [new("a", 2)])
    assert retried.duplicate and retried.events[0].seq == 4
    assert store.session.conn is not conn and store.session.reconnects == 1
    assert store.count_events() == 4 and store.verify_chain().ok
