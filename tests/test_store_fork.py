"""A Ledger is not carried across `fork()` (store/threads.py): real forks, on SQLite and PostgreSQL.

A parent and a child sharing a PostgreSQL connection read each other's answers, and a child closing
or freeing it would end the parent's session (libpq's Terminate); SQLite says a connection must not
cross a fork. The child's every call is refused with one line naming the process that opened the
ledger, the child sends and closes nothing on the inherited connection, the parent goes on with the
same session, and a ledger opened in the child works.
"""

from __future__ import annotations

import gc
import json
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Workspace
from test_store_contract import new

from lifecycle_fsm import Ledger, State
from lifecycle_fsm.replay.verify import verify
from lifecycle_fsm.store import InputError
from lifecycle_fsm.store.base import verify_chain
from lifecycle_fsm.store.open import open_store


def in_child(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Fork; run `body` in the child and hand back what it returned (or the error it raised)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 0
        try:
            os.close(read)
            try:
                result = body()
            except BaseException as e:  # reported to the parent, which fails the test
                result, code = {"crashed": f"{type(e).__name__}: {e}"}, 1
            with os.fdopen(write, "w") as out:
                out.write(json.dumps(result))
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    _, status = os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(text)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def refusal(call: Callable[[], object]) -> str:
    try:
        call()
    except InputError as e:
        return str(e)
    return "not refused"


def backend_target(backend: str, ws: Workspace, request: pytest.FixtureRequest) -> str:
    return str(ws.db) if backend == "sqlite" else str(request.getfixturevalue("pg_url"))


def _session_pids(ledger: Ledger) -> tuple[int, int]:
    """The server pids of a PostgreSQL ledger's session and its follower's LISTEN connection."""
    session = ledger.store.session  # type: ignore[attr-defined]
    return session.conn.info.backend_pid, session._listener.info.backend_pid


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_child_is_refused_the_parent_goes_on_and_a_ledger_opened_in_the_child_works(
    ws: Workspace, request: pytest.FixtureRequest, backend: str
) -> None:
    target = backend_target(backend, ws, request)
    manifests = [ws.dpo(f"dpo-{n}") for n in range(4)]
    ledger = Ledger.open(target, actor="parent", synchronous="NORMAL")
    ledger.init(event_id="f/init")
    ledger.activate_baseline(ws.baseline(), event_id="f/base")
    ledger.receive(manifests[0], event_id="f/recv-0")
    postgres = backend == "postgres"
    if postgres:  # no reference to the session kept here: the child must be able to free it
        assert ledger.store.wait_for_new(0, timeout=0) is True  # type: ignore[attr-defined]  # its LISTEN too
        pids = _session_pids(ledger)
    parent = os.getpid()

    def child() -> dict[str, Any]:
        said = {
            "receive": refusal(lambda: ledger.receive(manifests[1], event_id="f/child-1")),
            "read": refusal(lambda: ledger.candidate("dpo-0")),
            "store": refusal(ledger.store.head),
            "iterate": refusal(lambda: list(ledger.events())),
        }
        inherited = weakref.ref(ledger.store)
        ledger.close()  # closes nothing here: the connection is the parent's
        gc.collect()  # and freeing it sends nothing (PostgreSQL: no Terminate reaches the parent's session)
        said["freed"] = str(inherited() is None)
        with Ledger.open(target, actor="child", synchronous="NORMAL") as own:  # what the message asks for
            said["own"] = str(own.receive(manifests[2], event_id="f/child-2").state)
        return said

    said = in_child(child)
    expected = f"this ledger was opened in process {parent}, before a fork; a store (and a Ledger) is not carried"
    for what in ("receive", "read", "store", "iterate"):
        assert expected in said[what] and "open it again in this process" in said[what], (what, said[what])
        assert "\n" not in said[what]
    assert said["own"] == "received" and said["freed"] == "True"
    time.sleep(0.2)  # a Terminate the child sent would have ended the parent's session by now
    assert ledger.receive(manifests[3], event_id="f/recv-3").state is State.RECEIVED
    if postgres:  # the same sessions, never reconnected
        assert ledger.store.wait_for_new(0, timeout=0) is True  # type: ignore[attr-defined]
        assert _session_pids(ledger) == pids and ledger.store.session.reconnects == 0  # type: ignore[attr-defined]
    assert sorted(ledger.candidate_ids()) == ["dpo-0", "dpo-2", "dpo-3"]
    assert verify(ledger.store)["ok"]
    ledger.close()


class _LeaveTheBlock(Exception):
    """Raised in the child to leave the parent's `with store.transaction()` block as an error would."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_inside_a_transaction_leaves_it_to_the_parent(
    ws: Workspace, request: pytest.FixtureRequest, backend: str
) -> None:
    """Forked inside `store.transaction()`: the child going on with the block is refused, and leaving it
    (the rollback path) sends and rolls back nothing (SQLite: a rollback there would reset the shared WAL
    index under the parent's uncommitted rows); the parent, still in its block, commits it whole."""
    store = open_store(backend_target(backend, ws, request), synchronous="NORMAL")
    read, write = os.pipe()
    said: dict[str, str] = {}
    try:
        with store.transaction() as tx:
            tx.append("a", 0, [new("a", 0)])
            pid = os.fork()
            if pid == 0:
                said["append"] = refusal(lambda: tx.append("a", 1, [new("a", 1, event_id="child")]))
                said["transaction"] = refusal(lambda: store.transaction().__enter__())
                raise _LeaveTheBlock
            _, status = os.waitpid(pid, 0)  # the child has left the block by now
            assert os.waitstatus_to_exitcode(status) == 0
            tx.append("a", 1, [new("a", 1)])
    except _LeaveTheBlock:  # the child only
        try:
            with os.fdopen(write, "w") as out:
                out.write(json.dumps(said))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        said = json.loads(answer.read())
    try:
        assert "before a fork" in said["append"] and "before a fork" in said["transaction"], said
        assert [(e.version, e.event_id) for e in store.read_stream("a")] == [(1, "a-0"), (2, "a-1")]
        assert verify_chain(store).ok
    finally:
        store.close()
