"""A PostgreSQL ledger whose connection drops (a server restart, a failover, a session ended by an
administrator) connects again at the start of its next call (store/postgres_session.py, `PgSession.recover`).

The drop is real: `pg_terminate_backend` on the ledger's own backend pid, and only that pid (the
test server is shared). The call that meets the drop fails with one StoreError saying so; the next
call, outside any transaction, opens a new session set up as at open (schema, timeouts, durability,
the follower's LISTEN); nothing reconnects inside a transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from backends import PG_BASE, pg_execute, with_schema
from conftest import Workspace
from test_store_contract import new

from lifecycle_fsm import Ledger, State
from lifecycle_fsm.replay.verify import verify
from lifecycle_fsm.store import EventFilter, StoreError
from lifecycle_fsm.store.base import event_at, hash_at, select_events, verify_chain
from lifecycle_fsm.store.postgres import PostgresEventStore

pytestmark = pytest.mark.postgres


def drop(store: PostgresEventStore) -> int:
    """End the store's own server session (and nothing else); its pid."""
    pid = store.session.conn.info.backend_pid
    assert pg_execute(PG_BASE, "SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
    return pid


def lost(error: pytest.ExceptionInfo[StoreError]) -> None:
    """One line saying the connection was lost and the next call connects again; psycopg's error as the cause."""
    text = str(error.value)
    assert "the connection to the server was lost" in text and "the next call on this ledger connects again" in text
    assert "\n" not in text
    assert isinstance(error.value.__cause__, psycopg.Error)


@pytest.fixture
def store(pg_store: PostgresEventStore) -> PostgresEventStore:
    return pg_store


def test_the_next_command_after_a_dropped_session_reconnects(ws: Workspace, pg_url: str) -> None:
    """The tester's supervisor: after the server ends its session, the command that met the drop fails
    once, clearly; every later one works on the same Ledger, and the failed one repeated with its key
    lands once."""
    sft = ws.baseline()
    manifests = [ws.dpo(f"dpo-{i}") for i in range(3)]
    with Ledger.open(pg_url, actor="sup", synchronous="NORMAL") as ledger:
        ledger.init(event_id="r/init")
        ledger.activate_baseline(sft, event_id="r/base")
        ledger.receive(manifests[0], event_id="r/recv-0")
        session = ledger.store.session  # type: ignore[attr-defined]
        before = drop(ledger.store)  # type: ignore[arg-type]
        with pytest.raises(StoreError) as failed:
            ledger.receive(manifests[1], event_id="r/recv-1")
        lost(failed)  # here its first read (is the key stored?) met the drop
        assert ledger.receive(manifests[2], event_id="r/recv-2").state is State.RECEIVED
        assert session.reconnects == 1 and session.conn.info.backend_pid != before
        again = ledger.receive(manifests[1], event_id="r/recv-1")  # the keyed retry the message asks for
        assert again.state is State.RECEIVED and not again.duplicate  # the drop came before it was sent
        assert ledger.receive(manifests[1], event_id="r/recv-1").duplicate
        assert sorted(ledger.candidate_ids()) == ["dpo-0", "dpo-1", "dpo-2"]
        assert verify(ledger.store)["ok"]


def test_every_method_fails_once_on_a_drop_then_reconnects(store: PostgresEventStore) -> None:
    """Each call meeting a dropped session is a StoreError from psycopg's error; the same call again
    works on a new session (reads, generators, both write paths, the maintenance transactions)."""
    calls: dict[str, Callable[[], Any]] = {
        "head": store.head,
        "count_events": store.count_events,
        "read_stream": lambda: store.read_stream("a"),
        "stream_version": lambda: store.stream_version("a"),
        "select_events": lambda: list(select_events(store)),
        "select_rows": lambda: list(store.select_rows(EventFilter(stream_id="a"))),
        "event_by_id": lambda: store.event_by_id("a-0"),
        "event_at": lambda: event_at(store, 1),
        "hash_at": lambda: hash_at(store, 1),
        "streams": store.streams,
        "guard_problems": store.guard_problems,
        "rebuild_stream_index": lambda: store.rebuild_stream_index(store.streams),
        "append_checkpoint": lambda: store.append_checkpoint(
            position=1, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t"
        ),
        "stream_snapshots": lambda: store.stream_snapshots(1),
        "latest_stream_snapshot": lambda: store.latest_stream_snapshot("a"),
        "select_checkpoints": lambda: list(store.select_checkpoints()),
        "verify_chain": lambda: verify_chain(store),
        "append": lambda: store.append("c", 0, [new("c", 0)]),
    }
    for n, (name, call) in enumerate(calls.items(), start=1):
        drop(store)
        with pytest.raises(StoreError) as failed:
            call()
        lost(failed)
        if name == "append":  # the one-trip append: its commit went with it
            assert "whether it committed is unknown: repeat the command with the same event_id" in str(failed.value)
        if name in ("append_checkpoint", "rebuild_stream_index"):  # the drop met at BEGIN, before any COMMIT
            assert "nothing of this transaction was committed" in str(failed.value)
        call()  # the same call again: a new session
        assert store.session.reconnects == n, name
    assert [e.version for e in store.read_stream("c")] == [1]  # the append that met the drop sent nothing
    assert verify_chain(store).ok and store.guard_problems() == []


def test_the_new_session_is_set_up_as_at_open(pg_url: str) -> None:
    """Same schema (from the URL), the same timeouts and durability on the new session, and appends go on."""
    url = pg_url + "%20-clock_timeout%3D5s"  # a timeout the URL sets is kept, as at open
    with PostgresEventStore(url, synchronous="FULL", idle_timeout=42) as store:
        for n in range(3):
            store.append("a", n, [new("a", n)])
        drop(store)
        with pytest.raises(StoreError):
            store.head()
        for n in range(3, 6):
            store.append("a", n, [new("a", n)])
        conn = store.session.conn
        shown = conn.execute(
            "SELECT current_schema(), current_setting('lock_timeout'), "
            "current_setting('idle_in_transaction_session_timeout'), current_setting('synchronous_commit'), "
            "current_setting('client_encoding'), current_setting('application_name')"
        ).fetchone()
        assert shown == (store.session.schema, "5s", "42s", "on", "UTF8", "lifecycle-fsm")
        assert store.count_events() == 6 and verify_chain(store).ok


def test_nothing_reconnects_inside_a_transaction(store: PostgresEventStore) -> None:
    """A drop inside `transaction()` fails that transaction (nothing of it committed, said so) and
    every statement after it in the block; the session comes back only after the block is left."""

    def drop_inside() -> None:
        with store.transaction() as tx:
            tx.append("a", 2, [new("a", 2)])
            drop(store)
            try:
                tx.append("a", 3, [new("a", 3)])
            finally:
                assert store.session.reconnects == 0

    with pytest.raises(StoreError) as failed:
        drop_inside()
    lost(failed)
    assert "nothing of this transaction was committed" in str(failed.value)
    assert store.session.reconnects == 0
    assert [e.version for e in store.read_stream("a")] == [1, 2]  # connects again: the block's rows are gone
    assert store.session.reconnects == 1
    with store.read_snapshot():
        drop(store)
        with pytest.raises(StoreError) as failed_read:
            store.head()
        lost(failed_read)
        with pytest.raises(StoreError):
            store.count_events()  # still inside the snapshot: no new session under it
    assert store.session.reconnects == 1
    assert store.count_events() == 3 and store.session.reconnects == 2


def test_a_follower_listens_again_after_its_connection_drops(store: PostgresEventStore, pg_url: str) -> None:
    """`wait_for_new`'s LISTEN connection, dropped, is opened (and LISTENs) again on the next wait."""
    assert store.wait_for_new(3, timeout=0.05) is False
    listener = store.session._listener
    assert listener is not None
    pg_execute(PG_BASE, "SELECT pg_terminate_backend(%s)", (listener.info.backend_pid,))
    with pytest.raises(StoreError):
        store.wait_for_new(3, timeout=0.05)
    with PostgresEventStore(pg_url, synchronous="NORMAL") as other:
        other.append("b", 1, [new("b", 1)])
    assert store.wait_for_new(3, timeout=5) is True
    fresh = store.session._listener
    assert fresh is not None and fresh is not listener
    assert fresh.execute("SELECT pg_listening_channels()").fetchall() == [(store.session.channel,)]


def test_a_server_refusing_the_new_session_is_one_line_and_tried_again(store: PostgresEventStore, pg_url: str) -> None:
    """While the server refuses new sessions (here: the ledger's role may not log in), each call is one
    StoreError saying the session could not be opened again; once it may, the next call connects."""
    role = f"lc_{uuid.uuid4().hex[:12]}"
    schema = store.session.schema
    pg_execute(PG_BASE, f"CREATE ROLE {role} LOGIN")
    try:
        pg_execute(
            PG_BASE,
            f"GRANT USAGE ON SCHEMA {schema} TO {role}; GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}",
        )
        url = with_schema(PG_BASE.replace("postgres@", f"{role}@"), str(schema))
        with PostgresEventStore(url, synchronous="NORMAL") as mine:
            assert mine.count_events() == 3
            pg_execute(PG_BASE, f"ALTER ROLE {role} NOLOGIN")
            drop(mine)
            with pytest.raises(StoreError) as failed:
                mine.count_events()
            lost(failed)
            for _ in range(2):
                with pytest.raises(StoreError, match="cannot connect again") as refused:
                    mine.count_events()
                assert "\n" not in str(refused.value) and "not permitted to log in" in str(refused.value)
            pg_execute(PG_BASE, f"ALTER ROLE {role} LOGIN")
            assert mine.count_events() == 3 and mine.session.reconnects == 1
    finally:
        pg_execute(PG_BASE, f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_a_closed_store_is_not_reopened(store: PostgresEventStore) -> None:
    """`close()` is final: a later call is a StoreError, no new session."""
    store.close()
    with pytest.raises(StoreError):
        store.head()
    assert store.session.reconnects == 0
