"""The pipelined one-round-trip append on PostgreSQL (store/postgres_pipeline.py).

The lock, the insert and the commit go as separate statements in one round trip: these
tests pin that the insert still reads the head after the lock was granted, that values
arrive exactly as text parameters, that a statement whose preparation failed is prepared
again, and that an interrupted round trip leaves no half-used session behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from backends import pg_execute
from test_store_contract import new

from store import InputError, StoreError
from store.postgres import PostgresEventStore

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
    with PostgresEventStore(pg_url, synchronous="NORMAL") as other:
        other.session.pipeline.supported = store.session.pipeline.supported

        def hold() -> None:
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
        held = other.event_at(4)
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
    with pytest.raises(TypeError):
        pipeline.param(1.5)


def test_an_interrupted_round_trip_closes_the_session(store: PostgresEventStore) -> None:
    """Interrupted while waiting for the answer (Ctrl-C), the session is closed rather than left in
    pipeline mode with answers unread; every later call is a StoreError."""
    conn = store.session.conn

    def interrupted(gen: Any, *args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    conn.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        store.append("a", 2, [new("a", 2)])
    assert conn.closed
    with pytest.raises(StoreError):
        store.append("a", 2, [new("a", 2)])
    with pytest.raises(StoreError):
        store.count_events()
