"""The hash chain on every backend: identical hashes everywhere, and any edit behind the store's back is found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import BACKEND_NAMES, Backend, backend_params, make_backend
from test_store_contract import new

from store import EventStore


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


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
        assert store.verify_chain().ok, name
        logs.append(list(store.select_events()))
        store.close()
    assert logs[0] == logs[1] == logs[2]


def test_verify_chain_ok_on_good_log(filled: EventStore) -> None:
    """An untouched log verifies, with its count and head."""
    report = filled.verify_chain()
    assert (report.ok, report.events, report.head, report.bad_seq) == (True, 5, filled.head(), None)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("payload", '{"n":666}'),
        ("actor", "mallory"),
        ("recorded_at", "2030-01-01T00:00:00.000000Z"),
        ("type", "Forged"),
        ("event_id", "forged-id"),
        ("schema_version", 9),
        ("stream_id", "b"),
        ("version", 9),
    ],
)
def test_edited_column_breaks_chain_at_that_seq(backend: Backend, filled: EventStore, column: str, value: Any) -> None:
    """Editing any column of seq 3 (guard bypassed) makes verify_chain report seq 3."""
    if column == "stream_id":
        value = "c"  # a stream with no version clash
    backend.tamper(3, column, value)
    report = filled.verify_chain()
    assert (report.ok, report.bad_seq, report.events) == (False, 3, 5)
    assert report.reason


def test_edited_link_alone_breaks_chain_at_that_seq(backend: Backend, filled: EventStore) -> None:
    """Only `prev_hash` edited: the row's own hash still matches its content, the link does not."""
    backend.tamper(3, "prev_hash", "f" * 64)
    report = filled.verify_chain()
    assert (report.ok, report.bad_seq) == (False, 3)
    assert report.reason is not None and "prev_hash" in report.reason


def test_edited_hash_breaks_chain_at_that_seq(backend: Backend, filled: EventStore) -> None:
    """Only `hash` edited: it no longer matches the row's content."""
    backend.tamper(3, "hash", "e" * 64)
    report = filled.verify_chain()
    assert (report.ok, report.bad_seq) == (False, 3)


def test_deleted_row_breaks_chain_at_the_next_seq(backend: Backend, filled: EventStore) -> None:
    """Removing seq 3 (guard bypassed) is caught at seq 4 (a gap)."""
    backend.delete(3)
    report = filled.verify_chain()
    assert (report.ok, report.bad_seq) == (False, 4)
