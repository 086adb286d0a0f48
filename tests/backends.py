"""The store backends every contract test runs against: memory, an SQLite file, a PostgreSQL schema.

PostgreSQL is reached at `LIFECYCLE_TEST_PG` (default postgresql://postgres@127.0.0.1:5432/test);
each test gets a schema of its own, dropped afterwards. Without a server the PostgreSQL
cases skip, except under `CI=true`, where an unreachable server is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import pytest

from lifecycle_fsm.store import EventStore, MemoryEventStore, StoredEvent

PG_BASE = os.environ.get("LIFECYCLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
BACKEND_NAMES = ("memory", "sqlite", "postgres")
DURABLE = ("sqlite", "postgres")
_reachable: bool | str | None = None


def with_schema(base: str, schema: str) -> str:
    """`base` with `options=-csearch_path=<schema>` added to its query string."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def require_postgres() -> None:
    """Skip (or, under CI=true, fail) when the test server does not answer."""
    global _reachable  # noqa: PLW0603 - one connection attempt per test session
    if _reachable is None:
        try:
            import psycopg

            psycopg.connect(PG_BASE, connect_timeout=5).close()
            _reachable = True
        except Exception as e:  # any failure: the reason is reported below
            _reachable = f"{type(e).__name__}: {e}"
    if _reachable is not True:
        message = f"PostgreSQL at {PG_BASE} is not reachable ({_reachable})"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; under CI=true this is a failure, not a skip")
        pytest.skip(message)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema (dropped after the test)."""
    require_postgres()
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(PG_BASE, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(PG_BASE, schema)
    finally:
        with psycopg.connect(PG_BASE, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Any]:
    """A PostgreSQL store in a fresh schema holding a0 a1 on stream a, then b0 (seq 1..3)."""
    from test_store_contract import new

    from lifecycle_fsm.store.postgres import PostgresEventStore

    with PostgresEventStore(pg_url, synchronous="NORMAL") as s:
        s.append("a", 0, [new("a", 0), new("a", 1)])
        s.append("b", 0, [new("b", 0)])
        yield s


def pg_execute(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on a plain psycopg connection (not our code), autocommit; its rows if any."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


@attrs.define
class Backend:
    """One ledger on one backend: open handles to it, and edit it behind the store's back."""

    name: str
    target: str | None  # the file path or URL; None for memory
    _memory: MemoryEventStore | None = None

    def open(self, **kwargs: Any) -> EventStore:
        if self.name == "memory":
            if self._memory is None:
                self._memory = MemoryEventStore()
            return self._memory
        from lifecycle_fsm.store.open import open_store

        assert self.target is not None
        return open_store(self.target, synchronous=kwargs.pop("synchronous", "NORMAL"), **kwargs)

    def tamper(self, seq: int, column: str, value: Any) -> None:
        """Edit one column of one row, bypassing the append-only guard (an attacker with the keys)."""
        if self.name == "memory":
            assert self._memory is not None
            log = self._memory._log
            log[seq - 1] = attrs.astuple(attrs.evolve(StoredEvent(*log[seq - 1]), **{column: value}))
        elif self.name == "sqlite":
            import sqlite3

            with sqlite3.connect(str(self.target), isolation_level=None) as conn:
                conn.execute("DROP TRIGGER IF EXISTS events_refuse_update")
                conn.execute(f"UPDATE events SET {column} = ? WHERE seq = ?", (value, seq))
                _restore_triggers(conn)
        else:
            assert self.target is not None
            pg_execute(
                self.target,
                "ALTER TABLE events DISABLE TRIGGER USER; "
                f"UPDATE events SET {column} = {_literal(value)} WHERE seq = {int(seq)}; "
                "ALTER TABLE events ENABLE TRIGGER USER",
            )

    def delete(self, seq: int) -> None:
        """Remove one row behind the store's back."""
        if self.name == "memory":
            assert self._memory is not None
            del self._memory._log[seq - 1]
        elif self.name == "sqlite":
            import sqlite3

            with sqlite3.connect(str(self.target), isolation_level=None) as conn:
                conn.execute("DROP TRIGGER IF EXISTS events_refuse_delete")
                conn.execute("DELETE FROM events WHERE seq = ?", (seq,))
                _restore_triggers(conn)
        else:
            assert self.target is not None
            pg_execute(
                self.target,
                "ALTER TABLE events DISABLE TRIGGER USER; "
                f"DELETE FROM events WHERE seq = {int(seq)}; ALTER TABLE events ENABLE TRIGGER USER",
            )


def _restore_triggers(conn: Any) -> None:
    """Put the append-only triggers back after the edit, as a careful attacker would (`verify`
    reports missing ones; these edits are for the chain's own checks to catch)."""
    from lifecycle_fsm.store.sqlite_schema import SCHEMA

    for statement in SCHEMA:
        conn.execute(statement)


def _literal(value: Any) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if name == "memory":
        return Backend("memory", None)
    if name == "sqlite":
        return Backend("sqlite", str(tmp_path / "contract.db"))
    return Backend("postgres", request.getfixturevalue("pg_url"))


def backend_params(names: tuple[str, ...] = BACKEND_NAMES) -> list[Any]:
    """pytest params for `names`, the PostgreSQL one marked `postgres` (deselect with -m 'not postgres')."""
    return [pytest.param(n, id=n, marks=[pytest.mark.postgres] if n == "postgres" else []) for n in names]


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Each test that asks for it runs once per backend (a module may narrow the list with its own)."""
    return make_backend(request.param, request, tmp_path)
