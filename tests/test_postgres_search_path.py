"""Which schema a PostgreSQL URL's ledger is in: the first schema its search_path names, never `$user`.

PostgreSQL passes over a schema in the search_path that does not exist, so `$user` names the
role's schema only once someone creates it. A rule that followed it would move the URL's ledger
then; the store resolves the schema from the path's text alone and pins the session to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from backends import PG_BASE, pg_execute, require_postgres, with_schema
from test_store_contract import new

from lifecycle_fsm.store import StoreError
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.postgres_schema import ledger_schema


@pytest.mark.parametrize(
    ("path", "schema"),
    [
        ('"$user", public', "public"),
        ("$user,s1", "s1"),
        ("s1, $user", "s1"),
        ("$user", "bob"),
        ("", "bob"),
        ("MySchema,x", "myschema"),
        ('"a,b", public', "a,b"),
        ('"q""x", y', 'q"x'),
    ],
)
def test_the_ledger_schema_is_the_first_schema_the_path_names(path: str, schema: str) -> None:
    assert ledger_schema(path, "bob") == schema


@pytest.fixture
def role() -> Iterator[str]:
    """A login role of its own (its schema is created by the test), dropped with what it owns."""
    require_postgres()
    name = f"lifecycle_sp_{uuid.uuid4().hex[:8]}"
    pg_execute(PG_BASE, f"CREATE ROLE {name} LOGIN")
    try:
        yield name
    finally:
        pg_execute(PG_BASE, f"DROP OWNED BY {name} CASCADE; DROP ROLE {name}")


def test_a_user_schema_created_later_does_not_move_the_ledger(role: str) -> None:
    shared = f"s_{uuid.uuid4().hex[:10]}"
    pg_execute(PG_BASE, f"CREATE SCHEMA {shared} AUTHORIZATION {role}")
    url = with_schema(PG_BASE.replace("://postgres@", f"://{role}@"), f"$user,{shared}")
    with PostgresEventStore(url) as made:
        made.append("a", 0, [new("a", 0)])
        assert made.session.schema == shared
    pg_execute(PG_BASE, f"CREATE SCHEMA {role} AUTHORIZATION {role}")
    with PostgresEventStore(url, create=False) as again:
        assert again.session.schema == shared and again.count_events() == 1
    with PostgresEventStore(url) as writer:
        assert writer.append("a", 1, [new("a", 1)]).events[0].seq == 2
    assert pg_execute(PG_BASE, f"SELECT count(*) FROM {shared}.events") == [(2,)]
    assert pg_execute(PG_BASE, "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (role,)) == [(0,)]


def test_a_ledger_reached_through_user_before_is_named_not_passed_over(role: str) -> None:
    """A ledger that the path's `$user` entry used to lead to, while the schema it names holds none: refused."""
    pg_execute(PG_BASE, f"CREATE SCHEMA {role} AUTHORIZATION {role}")
    base = PG_BASE.replace("://postgres@", f"://{role}@")
    with PostgresEventStore(with_schema(base, role)) as made:
        made.append("a", 0, [new("a", 0)])
    shared = f"s_{uuid.uuid4().hex[:10]}"
    pg_execute(PG_BASE, f"CREATE SCHEMA {shared} AUTHORIZATION {role}")
    for create in (False, True):
        with pytest.raises(StoreError, match=f"schema '{role}' holds a ledger.*csearch_path%3D{role}"):
            PostgresEventStore(with_schema(base, f"$user,{shared}"), create=create)
    assert pg_execute(PG_BASE, "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (shared,)) == [(0,)]
