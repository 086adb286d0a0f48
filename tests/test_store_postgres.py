"""What only the PostgreSQL store has: triggers seen from psycopg, the INSERT/SELECT role, timeouts, URLs.

Everything a backend must do is in the contract suite (test_store_contract.py and its
siblings), which runs against PostgreSQL too. Each test here has a schema of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from backends import PG_BASE, pg_execute, with_schema
from test_store_contract import new

from lifecycle_fsm.store import ConcurrencyError, EventFilter, InputError, IntegrityError, StoreError, StreamHead
from lifecycle_fsm.store.base import event_at, select_events, verify_chain
from lifecycle_fsm.store.open import is_postgres_url, redact_url
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.postgres_schema import STORE_SCHEMA_VERSION

pytestmark = pytest.mark.postgres
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(pg_store: PostgresEventStore) -> PostgresEventStore:
    return pg_store


def test_a_rolled_back_transaction_keeps_the_prepared_statements(store: PostgresEventStore) -> None:
    """Lost races (a ROLLBACK each) between repeated appends: later appends still work (psycopg
    prepares statements it sees repeated, and may DEALLOCATE them after a ROLLBACK)."""

    def one_append() -> None:
        with store.transaction() as tx:
            version = tx.stream_version("a")
            tx.append("a", version, [new("a", version)], expect=[("b", 1)])

    for _ in range(8):  # repeated shapes: the store prepares its statements (and psycopg would its own)
        one_append()
    version = store.stream_version("a")

    def lose_a_race() -> None:
        with store.transaction() as tx:
            tx.append("a", version, [new("a", 100)], expect=[("b", 0)])  # stale: the transaction rolls back

    with pytest.raises(ConcurrencyError):
        lose_a_race()
    for _ in range(3):
        one_append()
    assert store.stream_version("a") == 13 and verify_chain(store).ok


# --- the database refuses to rewrite history ----------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET payload = '{}' WHERE seq = 2",
        "DELETE FROM events WHERE seq = 2",
        "TRUNCATE events",
        "INSERT INTO events SELECT * FROM events WHERE seq = 2 ON CONFLICT (seq) DO UPDATE SET actor = 'mallory'",
    ],
    ids=["update", "delete", "truncate", "upsert"],
)
def test_history_cannot_be_rewritten_even_by_the_owner(store: PostgresEventStore, pg_url: str, statement: str) -> None:
    """A plain psycopg connection (superuser, table owner) is refused by the triggers; the chain still verifies."""
    with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
        pg_execute(pg_url, statement)
    assert store.count_events() == 3 and verify_chain(store).ok


@pytest.fixture
def app_role(store: PostgresEventStore, pg_url: str) -> Iterator[str]:
    """A login role with the grants docs/postgres.md gives only, and a URL that connects as it."""
    role = f"lifecycle_app_{uuid.uuid4().hex[:8]}"
    schema = store.session.schema
    pg_execute(PG_BASE, f"CREATE ROLE {role} LOGIN")
    pg_execute(
        pg_url,
        f"GRANT USAGE ON SCHEMA {schema} TO {role}; "
        f"GRANT SELECT, INSERT ON events, checkpoints, checkpoint_streams TO {role}; "
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON streams TO {role}; GRANT SELECT ON meta TO {role}; "
        f"GRANT SELECT, INSERT, DELETE ON event_index TO {role}",
    )
    base = PG_BASE.replace("://postgres@", f"://{role}@")
    assert base != PG_BASE, "LIFECYCLE_TEST_PG must connect as user postgres for this test"
    try:
        yield with_schema(base, str(schema))
    finally:
        pg_execute(PG_BASE, f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_a_ledger_made_when_commits_wrote_the_state_index_is_upgraded_by_its_owner(
    app_role: str, store: PostgresEventStore, pg_url: str
) -> None:
    """Without the append function that leaves the index to checkpoints, a role that may not change the
    schema is refused every append, in one line; the owner's next open adds it, and the role appends."""
    signature = (
        "bigint, text, bigint, text, text, integer, text, text, text, text, text, text, text, text, text, boolean, text"
    )
    pg_execute(pg_url, f"DROP FUNCTION lifecycle_append({signature})")
    with PostgresEventStore(app_role, synchronous="NORMAL") as app:
        with pytest.raises(StoreError, match="older than this release; open it once as a role that may change"):
            app.append("a", 2, [new("a", 2)])
        assert app.count_events() == 3
    with PostgresEventStore(pg_url, synchronous="NORMAL"):
        pass
    with PostgresEventStore(app_role, synchronous="NORMAL") as app:
        app.append("a", 2, [new("a", 2)])
        app.append("a", 3, [new("a", 3)])  # the one-statement append, through the function
        assert app.count_events() == 5 and verify_chain(app).ok


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET payload = '{}' WHERE seq = 2",
        "DELETE FROM events WHERE seq = 2",
        "TRUNCATE events",
        "ALTER TABLE events DISABLE TRIGGER USER",
        "SET session_replication_role = replica",
        "LOCK TABLE events IN EXCLUSIVE MODE",
    ],
    ids=["update", "delete", "truncate", "disable-trigger", "replication-role", "lock-table"],
)
def test_the_insert_select_role_runs_the_ledger_and_cannot_rewrite_it(
    app_role: str, store: PostgresEventStore, statement: str
) -> None:
    """The role docs/postgres.md describes appends, checkpoints and rebuilds the index, but is refused every
    way around the triggers."""
    with PostgresEventStore(app_role, synchronous="NORMAL") as app:
        app.append("a", 2, [new("a", 2)])
        app.append_checkpoint(
            position=4, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t", streams=[("a", 3, "{}")]
        )
        app.rebuild_stream_index(lambda: [StreamHead("a", 3, "received", None)])
        assert verify_chain(app).ok and app.count_events() == 4
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        pg_execute(app_role, f"BEGIN; {statement}; COMMIT" if statement.startswith("LOCK") else statement)
    assert store.count_events() == 4 and verify_chain(store).ok


def test_payload_and_time_are_text_not_jsonb(store: PostgresEventStore, pg_url: str) -> None:
    """The columns the chain hashes are stored as text: jsonb and timestamptz would rewrite them."""
    rows = pg_execute(
        pg_url,
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'events' AND column_name IN ('payload', 'recorded_at')",
    )
    assert sorted(rows) == [("payload", "text"), ("recorded_at", "text")]


# --- the write lock and its timeouts ----------------------------------------------------------------


def _hold_lock(
    url: str, key: int, seconds: float, locked: threading.Event, release: threading.Event | None = None
) -> None:
    """Hold the ledger's lock for `seconds`, or until `release` is set."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        locked.set()
        (release or threading.Event()).wait(seconds)
        conn.rollback()


def test_second_writer_waits_for_the_lock(store: PostgresEventStore, pg_url: str) -> None:
    """While another session holds the ledger's lock briefly, an append waits and then lands after it."""
    locked = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(pg_url, store.session.lock_key, 0.3, locked))
    holder.start()
    assert locked.wait(30)
    started = time.monotonic()
    result = store.append("a", 2, [new("a", 2)])
    holder.join()
    assert result.events[0].seq == 4 and time.monotonic() - started >= 0.2


def test_lock_held_past_lock_timeout_is_store_error(store: PostgresEventStore, pg_url: str) -> None:
    """A writer that cannot get the lock within busy_timeout gets StoreError naming lock_timeout; nothing lands."""
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(pg_url, store.session.lock_key, 1.0, locked, release))
    holder.start()
    assert locked.wait(30)
    try:
        with PostgresEventStore(pg_url, busy_timeout=0.1) as impatient, pytest.raises(StoreError, match="lock_timeout"):
            impatient.append("a", 2, [new("a", 2)])
    finally:
        release.set()
        holder.join()
    assert store.count_events() == 3
    assert store.append("a", 2, [new("a", 2)]).events[0].seq == 4  # the session is usable afterwards


def test_a_zero_lock_timeout_in_the_url_still_gives_up_and_names_a_holder_of_another_role(
    store: PostgresEventStore, pg_url: str, app_role: str
) -> None:
    """`lock_timeout=0` means "wait for ever" to PostgreSQL: the store's own bound applies instead. The
    holder runs as another role, whose state this one may not see: said so, never `None`. A read that
    meets a lock appended nothing and does not say so either."""
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(pg_url, store.session.lock_key, 5.0, locked, release))
    holder.start()
    assert locked.wait(30)
    started = time.monotonic()
    try:
        with (
            PostgresEventStore(app_role + "%20-clock_timeout%3D0", busy_timeout=0.3) as impatient,
            pytest.raises(StoreError, match="lock_timeout") as info,
        ):
            impatient.append("a", 2, [new("a", 2)])
        waited = time.monotonic() - started
    finally:
        release.set()  # only once the append has given up (or, waiting for ever, got the lock after 5 s)
        holder.join()
    assert waited < 4, "waited for the holder instead of its own bound"
    text = str(info.value)
    assert "None" not in text and "a session of another role" in text and "nothing was appended" in text, text
    with psycopg.connect(pg_url) as table_holder:
        table_holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        with (
            PostgresEventStore(app_role, busy_timeout=0.3, create=False) as reader,
            pytest.raises(StoreError) as read_info,
        ):
            reader.head()
        table_holder.rollback()
    assert "None" not in str(read_info.value) and "appended" not in str(read_info.value), str(read_info.value)
    assert store.count_events() == 3


def test_a_table_lock_past_lock_timeout_names_its_holder_not_the_write_lock(pg_url: str) -> None:
    """A session holding a lock on `events` (someone's `LOCK TABLE` or `ALTER TABLE … DISABLE TRIGGER` left
    open in psql) made reads and writes fail with "another writer held the ledger's write lock", naming no
    holder, though no writer held it: the message now names the table lock and the session holding it."""
    with PostgresEventStore(pg_url) as store:
        store.append("a", 0, [new("a", 0)])
    with psycopg.connect(pg_url, application_name="psql-left-open") as holder:
        holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        with PostgresEventStore(pg_url, busy_timeout=0.1) as impatient:
            for call in (impatient.head, lambda: impatient.append("a", 1, [new("a", 1)])):
                with pytest.raises(StoreError) as info:
                    call()
                text = str(info.value)
                assert "a lock on the ledger's table `events`" in text and "write lock" not in text, text
                assert f"held by server pid {holder.info.backend_pid} (psql-left-open" in text and "\n" not in text
        holder.rollback()
    assert pg_execute(pg_url, "SELECT count(*) FROM events") == [(1,)]


def test_a_writer_stalled_inside_its_transaction_is_ended(store: PostgresEventStore, pg_url: str) -> None:
    """idle_in_transaction_session_timeout ends a writer that stalls holding the lock: StoreError, nothing kept."""
    stalled = PostgresEventStore(pg_url, idle_timeout=0.3)

    def stall() -> None:
        with stalled.transaction() as tx:
            tx.append("a", 2, [new("a", 2)])
            time.sleep(1.0)

    try:
        with pytest.raises(StoreError, match="idle_in_transaction_session_timeout"):
            stall()
    finally:
        stalled.close()
    assert store.count_events() == 3
    assert store.append("b", 1, [new("b", 1)]).events[0].seq == 4  # the lock was released with it


# --- opening: URLs, schemas, errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://postgres:s3cret-pw@127.0.0.1:1/test", "Connection refused"),
        ("postgres://postgres:s3cret-pw@127.0.0.1:5432/no_such_db_here", "does not exist"),
        ("postgresql://postgres:s3cret-pw@127.0.0.1:5432/test?no_such_option=1", "invalid URI query parameter"),
        ("postgresql://postgres:s3cret-pw@[::1:5432/test", "PostgreSQL"),
        ("postgresql://127.0.0.1:5432/test?password=s3cret-pw&port=1", "Connection refused"),
    ],
    ids=["refused", "no-database", "bad-option", "bad-host", "password-parameter"],
)
def test_unusable_url_is_store_error_without_the_password(url: str, expected: str) -> None:
    """Refused connections, missing databases and malformed URLs are StoreError; the password never appears."""
    require = pytest.raises(StoreError, match=expected)
    with require as info:
        PostgresEventStore(url)
    assert "s3cret-pw" not in str(info.value) and "s3cret-pw" not in repr(info.value.args)
    assert not isinstance(info.value.__cause__, StoreError)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql:///ledgers?host=/var/run/postgresql&password=s3cret-pw",
            "postgresql:///ledgers?host=%2Fvar%2Frun%2Fpostgresql&password=***",
        ),
        ("postgres://", "postgres://"),
        ("postgresql://u:s3cret-pw@db/ledgers", "postgresql://u:***@db/ledgers"),
    ],
)
def test_a_url_without_a_host_is_named_as_a_url(url: str, shown: str) -> None:
    """A URL with no host part (a Unix socket: `postgresql:///db?host=/run/postgresql`) was named in messages
    and `migrate --json` as `postgresql:/db?…`, which is not a URL but a file name: the `//` is kept."""
    assert redact_url(url) == shown and is_postgres_url(redact_url(url))


def test_an_upper_case_scheme_connects(pg_url: str) -> None:
    """`POSTGRESQL://…` is taken for a URL (not a file name), but libpq refused it with "missing "=" after
    …in connection info string": the scheme is matched and passed on in lower case."""
    with PostgresEventStore(pg_url) as store:
        store.append("a", 0, [new("a", 0)])
    scheme, rest = pg_url.split("://", 1)
    with PostgresEventStore(f"{scheme.upper()}://{rest}", create=False) as upper:
        assert upper.count_events() == 1


def test_missing_schema_is_created_or_refused(pg_url: str) -> None:
    """A URL whose schema does not exist: a writer creates it, a reader (create=False) is told there is no ledger."""
    url = with_schema(PG_BASE, f"n_{uuid.uuid4().hex[:12]}")
    with pytest.raises(InputError, match="no ledger"):
        PostgresEventStore(url, create=False)
    try:
        with PostgresEventStore(url) as made:
            assert made.append("a", 0, [new("a", 0)]).events[0].seq == 1
        with PostgresEventStore(url, create=False) as again:
            assert again.count_events() == 1
    finally:
        pg_execute(url, "DROP SCHEMA IF EXISTS " + url.rsplit("%3D", 1)[1] + " CASCADE")


def test_ledger_lives_in_the_first_schema_of_the_search_path(pg_url: str) -> None:
    """`search_path=mine,shared`: the ledger is `mine`'s, never the one in `shared` that PostgreSQL would fall
    through to when `mine` is missing or holds no ledger (a reader is refused, a writer makes `mine`'s)."""
    shared = pg_url.rsplit("%3D", 1)[1]
    with PostgresEventStore(pg_url) as other:
        other.append("a", 0, [new("a", 0)])
    mine = f"n_{uuid.uuid4().hex[:12]}"
    url = with_schema(PG_BASE, f"{mine},{shared}")
    try:
        with pytest.raises(InputError, match="no ledger"):
            PostgresEventStore(url, create=False)
        pg_execute(pg_url, f"CREATE SCHEMA {mine}")  # there, but empty: still not the shared ledger
        with pytest.raises(InputError, match="no ledger"):
            PostgresEventStore(url, create=False)
        pg_execute(pg_url, f"DROP SCHEMA {mine}")
        with PostgresEventStore(url) as made:
            assert made.session.schema == mine
            assert made.count_events() == 0
            assert made.append("b", 0, [new("b", 0)]).events[0].seq == 1
        assert pg_execute(pg_url, f"SELECT count(*) FROM {mine}.events") == [(1,)]
        assert pg_execute(pg_url, "SELECT stream_id FROM events") == [("a",)]
    finally:
        pg_execute(pg_url, f"DROP SCHEMA IF EXISTS {mine} CASCADE")


@pytest.mark.parametrize("tail", ["x" * 70, "é" * 40, 'a,b""q""'], ids=["ascii", "two-byte", "comma-quote"])
def test_a_schema_name_past_63_bytes_is_the_one_the_server_cut(tail: str) -> None:
    """The server cuts a longer name to 63 bytes, and a quoted one may hold a comma: the URL's name still opens
    the ledger it created."""
    name = f"n_{uuid.uuid4().hex[:8]}_{tail}".replace('""', '"')
    url = with_schema(PG_BASE, '"' + name.replace('"', '""') + '",public')
    try:
        with PostgresEventStore(url) as made:
            made.append("a", 0, [new("a", 0)])
        with PostgresEventStore(url, create=False) as again:
            assert again.count_events() == 1 and again.session.schema is not None
            assert len(again.session.schema.encode()) <= 63 and name.startswith(again.session.schema)
    finally:
        cut = name.encode()[:63].decode(errors="ignore").replace('"', '""')
        pg_execute(PG_BASE, f'DROP SCHEMA IF EXISTS "{cut}" CASCADE')


def test_a_role_without_usage_on_the_schema_is_told_so(app_role: str, pg_url: str) -> None:
    """A role not granted USAGE on the ledger's schema was told there is no ledger and to `lifecycle init`
    one (PostgreSQL leaves a schema it may not use out of its search path): it is told the grant is missing."""
    schema = app_role.rsplit("%3D", 1)[1]
    role = app_role.split("://", 1)[1].split("@", 1)[0]
    pg_execute(pg_url, f"REVOKE USAGE ON SCHEMA {schema} FROM {role}")
    for create in (False, True):
        with pytest.raises(StoreError, match=f"may not use schema '{schema}'.*GRANT USAGE") as info:
            PostgresEventStore(app_role, create=create)
        assert "\n" not in str(info.value) and "lifecycle init" not in str(info.value)
    assert pg_execute(pg_url, "SELECT count(*) FROM events") == [(3,)]


def test_foreign_events_table_and_other_schema_version_are_refused(pg_url: str) -> None:
    """An `events` table that is not ours, or another store schema version, is refused, never written to."""
    pg_execute(pg_url, "CREATE TABLE events (id int)")
    with pytest.raises(StoreError, match="not a ledger"):
        PostgresEventStore(pg_url)
    pg_execute(pg_url, "DROP TABLE events")
    PostgresEventStore(pg_url).close()
    pg_execute(pg_url, "UPDATE meta SET value = %s", (str(STORE_SCHEMA_VERSION + 1),))
    with pytest.raises(StoreError, match="schema version"):
        PostgresEventStore(pg_url)


def test_bad_settings_and_unstorable_values_are_input_errors(store: PostgresEventStore, pg_url: str) -> None:
    """An unknown synchronous mode, and a NUL in a column PostgreSQL text cannot hold, are InputError."""
    with pytest.raises(InputError):
        PostgresEventStore(pg_url, synchronous="SOMETIMES")
    with pytest.raises(InputError):
        store.append("a\0b", 0, [new("a\0b", 0)])
    assert store.count_events() == 3


# A lost connection on every method, and the new session after it: tests/test_store_postgres_reconnect.py.


# --- the crash hooks ------------------------------------------------------------------------------

_FAULTY = """
import sys
from lifecycle_fsm.store import NewEvent
from lifecycle_fsm.store.postgres import PostgresEventStore
store = PostgresEventStore(sys.argv[1], synchronous="FULL")
store.append("crash", 0, [NewEvent("crash", "T", 1, {}, "crash-1", "2024-01-01T00:00:00Z", "t")])
print("returned")
"""


@pytest.mark.parametrize(("point", "kept"), [("before_commit", 0), ("after_commit", 1)])
def test_fault_hooks_kill_around_the_commit(store: PostgresEventStore, pg_url: str, point: str, kept: int) -> None:
    """kill@before_commit: the server rolls the rows back; kill@after_commit: the row is there, no reply."""
    env = {**os.environ, "LIFECYCLE_FAULT": f"kill@{point}"}
    done = subprocess.run(
        [sys.executable, "-c", _FAULTY, pg_url],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == -9 and "returned" not in done.stdout, done.stderr
    assert store.stream_version("crash") == kept
    assert verify_chain(store).ok
    if not kept:  # the dead writer's lock died with it: the next append gets the seq it never committed
        assert store.append("crash", 0, [new("crash", 0)]).events[0].seq == 4
    with pytest.raises(IntegrityError):
        store.append_checkpoint(position=99, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")


# --- the command line on a URL ------------------------------------------------------------------


def test_cli_on_a_url_reads_and_refuses_like_on_a_file(pg_url: str) -> None:
    """LIFECYCLE_DB takes a URL; a read on an empty schema is exit 3 and creates nothing; a dead server is exit 7
    with the password nowhere in stderr, even with debug logs."""
    from conftest import run_cli

    empty = run_cli(pg_url, "status")
    assert (empty.returncode, empty.stdout) == (3, "") and "no ledger" in empty.stderr
    assert pg_execute(pg_url, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()") == [(0,)]
    init = subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "init"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "LIFECYCLE_DB": pg_url},
        timeout=60,
        check=False,
    )
    assert init.returncode == 0, init.stderr
    assert run_cli(pg_url, "--json", "verify").returncode == 0
    dead = run_cli("postgresql://postgres:s3cret-pw@127.0.0.1:1/test", "--log-level", "debug", "init")
    assert dead.returncode == 7 and dead.stderr.startswith("Error: ") and dead.stderr.count("\n") == 1
    assert "s3cret-pw" not in dead.stderr + dead.stdout and "***" in dead.stderr


# --- the one-statement append ---------------------------------------------------------------------


def test_prepared_statements_survive_a_rollback(store: PostgresEventStore) -> None:
    """A transaction that rolls back (psycopg may then DEALLOCATE ALL its own) leaves ours usable."""
    for n in range(2, 10):  # past psycopg's own prepare threshold (5) too, had it one
        store.append("a", n, [new("a", n)])
        store.read_stream("a")
    with pytest.raises(RuntimeError):
        _fail_after_appending(store, 10)
    with pytest.raises(ConcurrencyError):
        store.append("a", 3, [new("a", 3, event_id="other")])
    for n in range(10, 13):
        assert store.append("a", n, [new("a", n)]).events[0].seq == n + 2
        assert store.read_stream("a")[-1].version == n + 1
    assert verify_chain(store).ok


def test_two_handles_taking_turns_stay_chained_and_dense(store: PostgresEventStore, pg_url: str) -> None:
    """Two stores on one schema append in turn: every append chains to the other's (the head is read
    under the lock), seq stays dense, the chain verifies, and retries of both handles' appends are
    duplicates."""
    with PostgresEventStore(pg_url, synchronous="NORMAL") as other:
        handles = (store, other)
        for n in range(2, 14):
            handle = handles[n % 2]
            result = handle.append("a", n, [new("a", n)])
            assert result.events[0].seq == n + 2 and not result.duplicate
        for n in (5, 12):  # a retry (same ids, same content) on the handle that did not write it
            again = handles[(n + 1) % 2].append("a", n, [new("a", n)])
            assert again.duplicate and again.events[0].seq == n + 2
        assert store.append("a", 14, [new("a", 14)]).events[0].seq == 16
    assert [e.seq for e in select_events(store)] == list(range(1, 17))
    assert verify_chain(store).ok
    assert [h.version for h in store.streams() if h.stream_id == "a"] == [15]


# --- LISTEN/NOTIFY wake-up for followers ---------------------------------------------------------


def test_wait_for_new_wakes_on_a_commit_from_another_process(store: PostgresEventStore, pg_url: str) -> None:
    """A follower blocked in wait_for_new wakes soon after another process commits (NOTIFY), long before
    its timeout; with nothing new it returns False after the timeout; an event already there is True at once."""
    assert store.wait_for_new(0, timeout=5) is True  # seq 1..3 exist: no waiting
    started = time.monotonic()
    assert store.wait_for_new(3, timeout=0.3) is False
    assert time.monotonic() - started >= 0.3
    writer = subprocess.Popen([sys.executable, "-c", _LATE_WRITER, pg_url], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        started = time.monotonic()
        assert store.wait_for_new(3, timeout=30) is True
        waited = time.monotonic() - started
    finally:
        assert writer.wait(60) == 0
    assert 0.4 <= waited < 10, waited  # woke on the commit (the writer sleeps 0.5 s first), not on the timeout
    assert event_at(store, 4) is not None


def _fail_after_appending(store: PostgresEventStore, version: int = 2) -> None:
    with store.transaction() as tx:
        tx.append("a", version, [new("a", version)])
        raise RuntimeError("the command failed after appending")


def test_notify_is_sent_by_commits_only(store: PostgresEventStore, pg_url: str) -> None:
    """A plain LISTEN connection hears nothing from an append that rolls back, and one notification per
    committed append, whether by store.append (one statement) or a transaction."""
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {store.session.channel}")
        with pytest.raises(RuntimeError):
            _fail_after_appending(store)
        assert list(listener.notifies(timeout=0.3)) == []
        store.append("a", 2, [new("a", 2)])
        with store.transaction() as tx:
            tx.append("b", 1, [new("b", 1)])
        heard = list(listener.notifies(timeout=2, stop_after=2))
    assert [n.channel for n in heard] == [store.session.channel] * 2


_LATE_WRITER = """
import sys, time
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.records import NewEvent
time.sleep(0.5)
with PostgresEventStore(sys.argv[1]) as s:
    s.append("a", 2, [NewEvent("a", "Happened", 1, {"n": 2}, "a-2", "2024-01-01T00:00:02Z", "t")])
"""


def test_reads_page_by_ranges_of_seqs_and_step_over_a_gap_wider_than_a_page(pg_url: str) -> None:
    """Pages are ranges of at most 2,000 consecutive seqs (each page's work bounded whatever plan the
    server picks: with stale statistics `ORDER BY seq LIMIT n` sorted every later row, per page). A
    range short of rows is a gap or the head: a 5,000-seq hole, cut behind the store's back, is stepped
    over to the rows after it, so the walk sees the gap and names the seq after it."""
    with PostgresEventStore(pg_url, synchronous="NORMAL") as s:
        for k in range(10):  # 10,000 events, seqs 1..10,000
            with s.transaction() as tx:
                tx.append(f"s{k}", 0, [new(f"s{k}", n, event_id=f"s{k}-{n}") for n in range(1000)])
        cut = "DELETE FROM events WHERE seq BETWEEN 3000 AND 7999"
        pg_execute(pg_url, f"ALTER TABLE events DISABLE TRIGGER USER; {cut}; ALTER TABLE events ENABLE TRIGGER USER")
        batches = list(s.select_rows())
        assert [r[0] for b in batches for r in b] == [*range(1, 3000), *range(8000, 10001)]
        assert all(0 < len(b) <= 2000 for b in batches)
        folded = [r[0] for b in s.select_rows(EventFilter(after=8500, before=9001)) for r in b]
        assert folded == list(range(8501, 9001))
        report = verify_chain(s)
        assert (report.ok, report.bad_seq) == (False, 8000)


def test_a_reader_goes_on_with_rows_committed_while_it_held_a_page(pg_url: str) -> None:
    """A page short of its range ends at the head; rows another connection commits while the caller
    holds that page are read next, from the last row read: the reader yields a prefix of the log, never
    skips (review: resuming from the range's end skipped seqs 101..2000 and verify reported a gap)."""
    with PostgresEventStore(pg_url, synchronous="NORMAL") as reader, PostgresEventStore(pg_url) as writer:
        writer.append("s", 0, [new("s", n, event_id=f"a-{n}") for n in range(100)])
        pages = reader.select_rows()
        first = next(pages)  # rows 1..100 of the range (0, 2000]
        with writer.transaction() as tx:
            tx.append("s", 100, [new("s", n, event_id=f"b-{n}") for n in range(100, 2600)])
        seqs = [r[0] for r in first] + [r[0] for b in pages for r in b]
        assert seqs == list(range(1, 2601))
        assert verify_chain(reader).ok
