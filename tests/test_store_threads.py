"""One store, one thread (store/threads.py), on both durable backends, with real threads.

Threads sharing one PostgreSQL connection read each other's answers. A store refuses any
thread but the one that opened it, before it sends anything, with the same `InputError`
on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from backends import DURABLE, Backend, backend_params, make_backend

from lifecycle_fsm import Ledger, LedgerClosedError, LifecycleError
from lifecycle_fsm.store import ConcurrencyError, EventStore, InputError, NewEvent
from lifecycle_fsm.store.base import verify_chain


@pytest.fixture(params=backend_params(DURABLE))
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    return make_backend(request.param, request, tmp_path)


def _event(stream: str, i: int) -> NewEvent:
    return NewEvent(stream, "Note", 1, {"i": i}, uuid.uuid4().hex, "2026-12-02T00:00:00.000000Z", "t")


def _in_thread(call: Callable[[], object]) -> BaseException | None:
    """What `call` raised in another thread (None: it returned)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # handed back to the test
            raised.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()
    return raised[0] if raised else None


def _refused(error: BaseException | None) -> None:
    assert isinstance(error, InputError), repr(error)
    assert "opened in another thread" in str(error) and "open one per thread" in str(error)


def test_a_store_refuses_another_thread_and_stays_whole(backend: Backend) -> None:
    store = backend.open()
    try:
        store.append("s", 0, [_event("s", 0)])
        _refused(_in_thread(lambda: store.append("s", 1, [_event("s", 1)])))
        _refused(_in_thread(store.head))
        batches = store.select_rows()  # a row generator handed to another thread
        _refused(_in_thread(lambda: next(iter(batches))))
        # The owner's store still works, nothing was appended by the refused calls.
        store.append("s", 1, [_event("s", 1)])
        assert store.head().seq == 2
        assert verify_chain(store).ok
    finally:
        store.close()


def test_a_refused_thread_cannot_roll_back_the_owners_transaction(backend: Backend) -> None:
    """The check comes before the connection is touched: a refused `transaction()` or append from
    another thread in the middle of the owner's transaction leaves that transaction to commit."""
    store = backend.open()
    try:
        with store.transaction() as tx:
            tx.append("s", 0, [_event("s", 0)])
            _refused(_in_thread(lambda: store.append("s", 0, [_event("s", 9)])))
            _refused(_in_thread(lambda: store.transaction().__enter__()))
            tx.append("s", 1, [_event("s", 1)])
        assert [e.version for e in store.read_stream("s")] == [1, 2]
    finally:
        store.close()


def test_a_transaction_object_refuses_another_thread_before_it_changes(backend: Backend) -> None:
    """A refused `tx.append` from another thread neither starts nor ends the owner's transaction
    (PostgreSQL: its next statement would go without BEGIN and the lock, or its pending rows would
    be sent), and leaves its rules whole: the block still fails and rolls back whole."""
    store = backend.open()

    def block(expected: int) -> None:
        with store.transaction() as tx:
            tx.append("t", 0, [_event("t", 0)])
            _refused(_in_thread(lambda: tx.append("s", 0, [_event("s", 0)])))
            _refused(_in_thread(lambda: tx.stream_version("t")))
            tx.append("t", 1, [_event("t", 1)], expect=[("s", expected)])

    try:
        with pytest.raises(ConcurrencyError):
            block(99)  # wrong: the stream is empty
        assert store.count_events() == 0  # rolled back whole
        block(0)
        assert [e.version for e in store.read_stream("t")] == [1, 2]
    finally:
        store.close()


def test_a_transaction_entered_by_another_thread_leaves_the_owners_alone(backend: Backend) -> None:
    """`store.transaction()` made by the owner but entered by another thread is refused on entry:
    its exit would otherwise roll back (PostgreSQL) the transaction the owner has open."""
    store = backend.open()
    try:
        with store.transaction() as tx:
            tx.append("s", 0, [_event("s", 0)])
            made = store.transaction()

            def enter() -> None:
                with made:
                    pass

            _refused(_in_thread(enter))
            tx.append("s", 1, [_event("s", 1)])
        assert [e.version for e in store.read_stream("s")] == [1, 2]
    finally:
        store.close()


_TX_CALLS: dict[str, Callable[[Any], object]] = {
    "stream_version": lambda tx: tx.stream_version("s"),
    "read_stream": lambda tx: tx.read_stream("s"),
    "streams": lambda tx: tx.streams(),
    "append": lambda tx: tx.append("s", 0, [_event("s", 0)]),
}


def test_every_transaction_method_is_checked(backend: Backend) -> None:
    """Each method of the `StoreTransaction` protocol refuses another thread with the same error
    (on SQLite several are plain reads `sqlite3` would refuse in its own words)."""
    from lifecycle_fsm.store.base import StoreTransaction

    protocol = {n for n in vars(StoreTransaction) if not n.startswith("_")}
    assert protocol == set(_TX_CALLS)
    store = backend.open()
    try:
        with store.transaction() as tx:
            for name, call in _TX_CALLS.items():
                error = _in_thread(lambda call=call: call(tx))
                assert isinstance(error, InputError), (name, repr(error))
        assert store.count_events() == 0
    finally:
        store.close()


def test_a_store_is_closed_by_its_own_thread(backend: Backend) -> None:
    """A store's `close` from another thread is refused on both backends. A Ledger closed from another
    thread is closed (a shutdown handler ending a blocked follow), and its opening thread closes the
    connection at its next call, which is refused as every later one is."""
    assert backend.target is not None
    store = backend.open()
    _refused(_in_thread(store.close))
    assert store.head().seq == 0
    store.close()
    ledger = Ledger.open(backend.target, synchronous="NORMAL", actor="t")
    ledger.init()
    inner = ledger.store
    assert _in_thread(ledger.close) is None
    assert ledger.closed
    with pytest.raises(LedgerClosedError):
        ledger.settings()
    with pytest.raises(LifecycleError, match="closed"):
        inner.head()
    ledger.close()


def test_threads_with_a_store_each_all_write(backend: Backend) -> None:
    """What the error tells the caller to do works: four threads, a store each, every event kept."""
    done: list[int] = []

    def write(k: int) -> None:
        store: EventStore = backend.open()
        try:
            for i in range(25):
                store.append(f"t{k}", i, [_event(f"t{k}", i)])
            done.append(k)
        finally:
            store.close()

    backend.open().close()  # the schema first
    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(done) == [0, 1, 2, 3]
    store = backend.open()
    try:
        assert store.count_events() == 100 and verify_chain(store).ok
    finally:
        store.close()


def test_a_ledger_shared_with_another_thread_is_refused(backend: Backend) -> None:
    """The embedding API says it too (README: one `Ledger` per thread)."""
    assert backend.target is not None
    with Ledger.open(backend.target, synchronous="NORMAL", actor="t") as ledger:
        before = ledger.init().settings
        _refused(_in_thread(lambda: ledger.advance_window(before.active_window + 5)))
        assert ledger.settings() == before  # nothing appended
