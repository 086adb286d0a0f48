"""The one-round-trip append on PostgreSQL: the server chains the rows under the lock.

The server computes `seq` and the sha256 chain hash from the header the client split
around `seq` (store/postgres_append.py); these tests pin that it hashes exactly what
SQLite hashes, that a hash the client disagrees with is reported, and that a stale
head (another writer appended) costs no extra round trip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle_fsm.store import ConcurrencyError, Head, IntegrityError, NewEvent, StoredEvent
from lifecycle_fsm.store.chain import GENESIS_HASH, canonical_json, chain_rows
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.postgres_append import check_server_chain
from lifecycle_fsm.store.sqlite import SQLiteEventStore

pytestmark = pytest.mark.postgres

# Everything orjson escapes or passes through as UTF-8: quotes, backslashes, control
# characters, U+2028, non-BMP characters, a would-be header fragment, and what client-side
# binding must quote (single quotes, a backslash before one, a placeholder, a comment).
_TRICKY = "q\"uote ' '' \\' \\back\tslash\n\u0001 \u2028 é 😀 ,\"seq\":9, $$ %s %% ); --"


def _event(stream: str, n: int, **extra: Any) -> NewEvent:
    payload = {"n": n, "text": _TRICKY, "nested": {"é": [1, 2.5, None, True, _TRICKY]}, **extra}
    return NewEvent(stream, f"Type{_TRICKY}", 1 + n % 2, payload, f"id-{n}-{_TRICKY}",
                    f"2024-01-01T00:00:{n:02d}.5Z", f"actor {_TRICKY}")  # fmt: skip


@pytest.fixture(params=["pipeline", "one message"])
def pg(pg_url: str, request: pytest.FixtureRequest) -> Iterator[PostgresEventStore]:
    """A store sending its appends pipelined, or (as with a libpq older than 14) as one simple-query message."""
    with PostgresEventStore(pg_url, synchronous="NORMAL") as store:
        store.session.pipeline.supported = request.param == "pipeline"
        yield store


@pytest.mark.parametrize("guess", ["right", "stale"])
def test_the_server_chains_every_character_as_sqlite_does(pg: PostgresEventStore, tmp_path: Path, guess: str) -> None:
    """One-event and many-event appends (the two statement shapes), by store.append and in a transaction,
    with the store's head guess right (the client's hashes are stored) or stale (the server hashes):
    every (seq, prev_hash, hash) is the same on both backends and both chains verify."""
    stream = f"candidate:{_TRICKY}"

    def appending(store: Any) -> Any:
        if guess == "stale" and store is pg:
            pg.last_head = Head(0, GENESIS_HASH)  # as if another writer had appended since
        return store

    with SQLiteEventStore(tmp_path / "l.db", synchronous="OFF") as lite:
        for store in (lite, pg):
            appending(store).append(stream, 0, [_event(stream, 0)])
            appending(store).append(stream, 1, [_event(stream, n) for n in (1, 2, 3)])
            appending(store).append("other", 0, [_event("other", 4)], expect=[(stream, 4)])
            with appending(store).transaction() as tx:
                tx.append(stream, 4, [_event(stream, 5)])
            events = [_event(stream, n) for n in range(6, 6 + 40)]
            appending(store).append(stream, 5, events, status="s", category="c")
        rows = [[(e.seq, e.prev_hash, e.hash, e.payload) for e in s.select_events()] for s in (lite, pg)]
        assert rows[0] == rows[1] and len(rows[0]) == 46
        assert lite.verify_chain().ok and pg.verify_chain().ok
        assert pg.streams() == lite.streams()


def test_a_stale_head_costs_no_extra_round_trip(pg: PostgresEventStore, pg_url: str) -> None:
    """Another handle appends between every two of ours: each append is still one round trip
    (with a guessed head it was a refused trip, then the head read under the lock, then the insert).
    Every exchange with the server, psycopg's or the store's pipeline, goes through `conn.wait`."""
    trips: list[Any] = []
    wait = pg.session.conn.wait

    def counted(gen: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(gen)
        return wait(gen, *args, **kwargs)

    pg.session.conn.wait = counted  # type: ignore[method-assign]
    with PostgresEventStore(pg_url, synchronous="NORMAL") as other:
        for n in range(6):
            other.append("b", n, [_event("b", n)])
            before = len(trips)
            result = pg.append("a", n, [_event("a", 10 + n)], fresh_ids=n % 2 == 0)
            assert len(trips) - before == 1, trips[before:]
            assert result.events[0].seq == 2 * n + 2 and not result.duplicate
    assert pg.verify_chain().ok


def test_a_moved_version_is_still_refused_in_one_message(pg: PostgresEventStore) -> None:
    pg.append("a", 0, [_event("a", 0)])
    with pytest.raises(ConcurrencyError, match="at version 1, expected 0"):
        pg.append("a", 0, [_event("a", 1)])
    with pytest.raises(ConcurrencyError, match="'ledger' is at version 0, expected 3"):
        pg.append("a", 1, [_event("a", 1)], expect=[("ledger", 3)])
    assert pg.count_events() == 1 and pg.verify_chain().ok


def test_a_server_hash_the_client_disagrees_with_is_an_integrity_error(tmp_path: Path) -> None:
    """The client keeps its own rows when the server found the guessed head, and re-hashes any
    other answer: rows chained after another head pass, a different hash or a broken link is reported."""
    events = [_event("a", 0), _event("a", 1)]
    with SQLiteEventStore(tmp_path / "l.db", synchronous="OFF") as lite:
        lite.append("b", 0, [_event("b", 9)])
        good = lite.append("a", 0, events).events  # chained after seq 1
    mine = chain_rows(Head(0, GENESIS_HASH), "a", 0, events)  # the client guessed an empty ledger
    assert check_server_chain([(r[0], r[9], r[10]) for r in mine], mine) == tuple(StoredEvent(*r) for r in mine)
    returned = [(e.seq, e.prev_hash, e.hash) for e in good]
    assert check_server_chain(returned, mine) == good
    for bad in (
        [returned[0], (3, returned[1][1], "f" * 64)],  # another hash
        [returned[0], (3, "0" * 64, returned[1][2])],  # not linked to the row before
        [returned[0], (4, returned[1][1], returned[1][2])],  # a gap in seq
    ):
        with pytest.raises(IntegrityError, match="this client computes"):
            check_server_chain(bad, mine)


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize("conforming", ["on", "off"])
def test_values_bound_client_side_arrive_exactly(pg_url: str, conforming: str, pipelined: bool) -> None:
    """The store quotes values itself only where a backslash is plain (standard_conforming_strings on);
    with it off it leaves quoting to psycopg. Either way every column reads back as written."""
    url = pg_url.replace("options=", f"options=-cstandard_conforming_strings%3D{conforming}%20")
    with PostgresEventStore(url, synchronous="NORMAL") as store:
        store.session.pipeline.supported = pipelined
        assert store.session.conn.execute("SHOW standard_conforming_strings").fetchone() == (conforming,)
        events = [_event(_TRICKY, n) for n in range(3)]
        for n in range(3):  # the second use of a shape is an EXECUTE with the values as arguments
            store.append(_TRICKY, n, events[n : n + 1], expect=[(_TRICKY, n)])
        got = store.read_stream(_TRICKY)
        assert [(e.event_id, e.type, e.actor, e.recorded_at, e.payload) for e in got] == [
            (e.event_id, e.type, e.actor, e.recorded_at, canonical_json(e.payload)) for e in events
        ]
        assert store.verify_chain().ok
        assert store.streams()[0].stream_id == _TRICKY
