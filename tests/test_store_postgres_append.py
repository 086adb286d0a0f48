"""The one-statement append on PostgreSQL: the server chains the row under the lock.

`lifecycle_append()` (store/postgres_schema.py) assigns `seq` and computes the sha256
chain hash from the header the client split around `seq` (`chain.header_parts`); these
tests pin that the server hashes exactly what `chain.event_hash` hashes (random rows),
that a hash the client disagrees with is reported, that the head is read after the lock
is granted, and that a transaction (chained by the client) agrees with it.
"""

from __future__ import annotations

import enum
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from backends import pg_execute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_contract import new

from lifecycle_fsm.store import ConcurrencyError, IntegrityError, NewEvent, StoreError
from lifecycle_fsm.store.base import event_at, select_events, verify_chain
from lifecycle_fsm.store.chain import canonical_json, event_hash, stamped
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.sqlite import SQLiteEventStore

pytestmark = pytest.mark.postgres

# Everything orjson escapes or passes through as UTF-8: quotes, backslashes, control characters,
# U+2028, non-BMP characters, a would-be header fragment, and what client-side binding must quote.
_TRICKY = "q\"uote ' '' \\' \\back\tslash\n\u0001 \u2028 é 😀 ,\"seq\":9, $$ %s %% ); --"


def _event(stream: str, n: int, **extra: Any) -> NewEvent:
    payload = {"n": n, "text": _TRICKY, "nested": {"é": [1, 2.5, None, True, _TRICKY]}, **extra}
    return NewEvent(
        stream, f"Type{_TRICKY}", 1 + n % 2, payload, f"id-{n}-{_TRICKY}", f"2024-01-01T00:00:{n:02d}.5Z", _TRICKY
    )


@pytest.fixture
def pg(pg_url: str) -> Iterator[PostgresEventStore]:
    with PostgresEventStore(pg_url, synchronous="NORMAL") as store:
        yield store


_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=12)
_events = st.lists(
    st.tuples(_text, _text, _text, _text, st.integers(1, 2**31 - 1), st.dictionaries(_text, _text, max_size=3)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_events)
def test_the_server_hashes_what_event_hash_hashes(pg: PostgresEventStore, rows: list[tuple[Any, ...]]) -> None:
    """Random rows through the one-statement append: every stored hash is `chain.event_hash` of its row."""
    for kind, event_id, recorded_at, actor, schema, payload in rows:
        stream = f"s{kind}"
        unique = f"{pg.count_events()}-{event_id}"
        event = NewEvent(stream, kind, schema, payload, unique, recorded_at, actor)
        stored = pg.append(stream, pg.stream_version(stream), [event], fresh_ids=True).events[0]
        assert stored.payload == canonical_json(payload)
        assert stored.hash == event_hash(
            stored.prev_hash,
            stored.seq,
            stream,
            stored.version,
            unique,
            kind,
            schema,
            stored.payload,
            recorded_at,
            actor,
        )
    assert verify_chain(pg).ok


# Times in the ledger's form a few microseconds apart (so they often go back), and some that are not.
_in_form = st.integers(0, 3).map(lambda n: f"2026-01-01T00:00:00.00000{n}Z") | st.sampled_from(
    # the edges of STAMP_LEAD (5 minutes) after those, an hour ahead, the last moment there is
    [
        "2026-01-01T00:05:00.000000Z",
        "2026-01-01T00:05:00.000004Z",
        "2026-01-01T01:00:00.000000Z",
        "9999-12-31T23:59:59.999999Z",
    ]
)
_times = st.lists(_in_form | st.sampled_from(["", "2026-01-01T00:00:00.000002", "2026-01-01T00:00:09Z", "\u00e9"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=_times, batch=st.booleans())
def test_the_server_stamps_a_time_as_stamped_does(
    pg: PostgresEventStore, tmp_path_factory: pytest.TempPathFactory, times: list[str], batch: bool
) -> None:
    """Random times through the one-statement append (the server stamps and hashes) and through a batch (the
    client does): each stored time is `chain.stamped` of the given one after the one before, as on SQLite."""
    with SQLiteEventStore(tmp_path_factory.mktemp("lite") / "l.db", synchronous="OFF") as lite:
        for store in (pg, lite):
            start = store.head().seq
            stream = f"t{start}"
            events = [NewEvent(stream, "Timed", 1, {}, f"{stream}-{n}", at, "a") for n, at in enumerate(times)]
            if batch and events:
                store.append(stream, 0, events)
            for n, event in enumerate([] if batch else events):
                store.append(stream, n, [event])
            stored = [e for e in select_events(store) if e.seq > start]
            previous = event_at(store, start).recorded_at if start else ""
            for event, given in zip(stored, times, strict=True):
                assert event.recorded_at == stamped(given, previous)
                previous = event.recorded_at
            assert verify_chain(store).ok


def test_one_statement_and_transactions_chain_as_sqlite_does(pg: PostgresEventStore, tmp_path: Path) -> None:
    """One-event appends (one statement, hashed by the server) and batches and transactions (chained by
    the client under the lock): every (seq, prev_hash, hash) is the same as on SQLite."""
    stream = f"candidate:{_TRICKY}"
    with SQLiteEventStore(tmp_path / "l.db", synchronous="OFF") as lite:
        for store in (lite, pg):
            store.append(stream, 0, [_event(stream, 0)])
            store.append(stream, 1, [_event(stream, n) for n in (1, 2, 3)])
            store.append("other", 0, [_event("other", 4)], expect=[(stream, 4)])
            with store.transaction() as tx:
                tx.append(stream, 4, [_event(stream, 5)])
            store.append(stream, 5, [_event(stream, n) for n in range(6, 46)])
        rows = [[(e.seq, e.prev_hash, e.hash, e.payload) for e in select_events(s)] for s in (lite, pg)]
        assert rows[0] == rows[1] and len(rows[0]) == 46
        assert verify_chain(lite).ok and verify_chain(pg).ok
        assert pg.streams() == lite.streams()


def test_a_server_hash_the_client_disagrees_with_is_an_integrity_error(pg: PostgresEventStore, pg_url: str) -> None:
    """The client re-hashes the row the server chained: a function changed behind the store's back
    (here: it hashes without the newline after the header) is reported, not trusted."""
    pg.append("a", 0, [_event("a", 0)])
    function = pg_execute(pg_url, "SELECT pg_get_functiondef('lifecycle_append'::regproc)")[0][0]
    changed = function.replace("|| p_header_after || E'\\n' ||", "|| p_header_after ||")
    assert changed != function
    pg_execute(pg_url, changed)
    with pytest.raises(IntegrityError, match="does not compute") as info:
        pg.append("a", 1, [_event("a", 1)])
    assert info.value.seq == 2 and not verify_chain(pg).ok


def test_a_moved_version_is_refused_and_a_retry_returns_what_was_stored(pg: PostgresEventStore) -> None:
    """A check that fails in the statement writes nothing; the transaction's path then names the stream."""
    first = pg.append("a", 0, [_event("a", 0)])
    with pytest.raises(ConcurrencyError, match="at version 1, expected 0"):
        pg.append("a", 0, [_event("a", 1)])
    with pytest.raises(ConcurrencyError, match="'ledger' is at version 0, expected 3"):
        pg.append("a", 1, [_event("a", 1)], expect=[("ledger", 3)])
    again = pg.append("a", 0, [_event("a", 0)])
    assert again.duplicate and again.events == first.events
    assert pg.count_events() == 1 and verify_chain(pg).ok


@pytest.mark.parametrize(("seq", "version"), [(0, 1), (1, 0)])
def test_the_table_refuses_a_row_before_the_first_seq_or_version(
    pg: PostgresEventStore, pg_url: str, seq: int, version: int
) -> None:
    """The chain starts at seq 1 and a stream at version 1: a row written behind the store's back at 0
    is refused by the table itself, so no reader ever meets it."""
    row = (seq, "a", version, "id-0", "T", 1, "{}", "2024-01-01T00:00:00Z", "me", "0" * 64, "0" * 64)
    with pytest.raises(psycopg.errors.CheckViolation):
        pg_execute(pg_url, "INSERT INTO events VALUES (" + ", ".join(["%s"] * len(row)) + ")", row)
    assert pg.count_events() == 0


def test_an_append_that_waited_for_the_lock_chains_to_what_the_holder_committed(pg_url: str) -> None:
    """Another writer appends and holds the lock; ours waits, then lands right after that row.

    The function reads the head in a statement of its own after taking the lock, so its snapshot
    is taken once the lock is granted (read committed): in one statement with the lock it would
    read the head from before the wait and collide on seq."""
    appended = threading.Event()

    def hold() -> None:  # its own store: a store is used by the thread that opened it
        with PostgresEventStore(pg_url, synchronous="NORMAL") as other, other.transaction() as tx:
            tx.append("b", 1, [new("b", 1)])
            appended.set()
            time.sleep(0.5)

    with PostgresEventStore(pg_url, synchronous="NORMAL") as store:
        store.append("a", 0, [new("a", 0), new("a", 1)])
        store.append("b", 0, [new("b", 0)])
        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert appended.wait(30)
            result = store.append("a", 2, [new("a", 2)])
        finally:
            holder.join()
        held = event_at(store, 4)
        assert held is not None and held.stream_id == "b"
        assert (result.events[0].seq, result.events[0].prev_hash) == (5, held.hash)
        assert verify_chain(store).ok


def test_an_append_works_again_once_its_table_is_back(pg: PostgresEventStore, pg_url: str) -> None:
    """With the events table gone the append fails (StoreError, not a psycopg error); once it is back,
    the next appends go through (nothing the failure left behind is reused)."""
    for n in range(6):  # past psycopg's prepare threshold
        pg.append("a", n, [new("a", n)], fresh_ids=True)
    pg_execute(pg_url, "ALTER TABLE events RENAME TO events_away")
    with pytest.raises(StoreError, match="not a ledger"):
        pg.append("a", 6, [new("a", 6)], fresh_ids=True)
    pg_execute(pg_url, "ALTER TABLE events_away RENAME TO events")
    for n in (6, 7):
        assert pg.append("a", n, [new("a", n)], fresh_ids=True).events[0].seq == n + 1
    assert verify_chain(pg).ok


class _Key(enum.StrEnum):
    ID = "key-1"


def test_a_str_subclass_goes_as_its_text(pg: PostgresEventStore) -> None:
    """An id or actor given as a StrEnum (a `str` subclass) is stored as its text."""
    event = new("a", 0, event_id=_Key.ID)
    event = NewEvent("a", event.type, event.schema_version, event.payload, _Key.ID, event.recorded_at, _Key.ID)
    stored = pg.append("a", 0, [event]).events[0]
    back = event_at(pg, stored.seq)
    assert back is not None and (back.event_id, back.actor) == ("key-1", "key-1")
    assert type(back.event_id) is str and back.hash == stored.hash and verify_chain(pg).ok


def test_a_real_interrupt_while_waiting_leaves_the_session_able_to_append(pg_url: str) -> None:
    """Ctrl-C while an append waits for the ledger's lock (another session holds it): psycopg cancels
    the query, nothing was written, and the next append after the lock is free goes through."""
    holder = psycopg.connect(pg_url)

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    with PostgresEventStore(pg_url, synchronous="NORMAL") as store:
        store.append("a", 0, [new("a", 0)])
        holder.execute(f"SELECT pg_advisory_xact_lock({store.session.lock_key})")
        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(KeyboardInterrupt):
                store.append("a", 1, [new("a", 1)])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            holder.rollback()
            holder.close()
        for n in (1, 2):
            assert store.append("a", n, [new("a", n)]).events[0].seq == n + 1
        assert store.count_events() == 3 and verify_chain(store).ok
