"""A Ctrl-C (KeyboardInterrupt) caught by a supervisor that embeds the Ledger leaves it usable, on both backends.

The tester's finding: an interrupt landing right after `BEGIN IMMEDIATE` returned (before the
store's `try`) kept SQLite's write lock: every later call on that Ledger failed "cannot start a
transaction within a transaction" and every other process "database is locked" until the process
exited. Every path that takes a transaction or the lock now does it inside its own `try`, and a
transaction nothing holds (a cleanup a second interrupt cut short) is rolled back by the next call;
on PostgreSQL a session an interrupt closed or left mid-exchange is replaced by the next call.

Two kinds of test: deterministic ones wrap the database connection the store uses (sqlite3's, or
psycopg's `execute`) to raise KeyboardInterrupt exactly where a signal would land, right after a
statement ran; real ones run a supervisor process that SIGINTs itself at a named point
(`LIFECYCLE_FAULT=int@after_begin`, …, store/faults.py). Each then checks what a supervisor needs:
the same Ledger's next command works, another process can write, nothing half-written, `verify` ok.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from backends import pg_execute
from conftest import REPO, Workspace
from test_store_contract import new

from lifecycle_fsm import Ledger, State
from lifecycle_fsm.replay import take_checkpoint
from lifecycle_fsm.replay.verify import verify
from lifecycle_fsm.store import InputError
from lifecycle_fsm.store.base import verify_chain
from lifecycle_fsm.store.postgres import PostgresEventStore
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.store.threads import ENV_VAR


@pytest.fixture(autouse=True)
def _no_inherited_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


class Interrupting:
    """The store's own sqlite3 connection, wrapped: a KeyboardInterrupt once, right after the statement
    `after` ran (where a Ctrl-C lands when its handler runs at the next bytecode), and once instead of
    running each statement of `refuse`, in turn (e.g. a second Ctrl-C before the handler's ROLLBACK)."""

    def __init__(self, conn: Any, *, after: str = "", refuse: tuple[str, ...] = ()) -> None:
        self._conn = conn
        self._after = after
        self._refuse = list(refuse)
        self.fired = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if self._refuse and sql == self._refuse[0]:
            self._refuse.pop(0)
            self.fired += 1
            raise KeyboardInterrupt
        result = self._conn.execute(sql, *args)
        if self._after and sql == self._after:
            self._after = ""
            self.fired += 1
            raise KeyboardInterrupt
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


_WRITER = """
import sys
from lifecycle_fsm import Ledger
with Ledger.open(sys.argv[1], busy_timeout=3, synchronous="NORMAL") as ledger:
    print(ledger.receive(sys.argv[2], event_id=sys.argv[3]).state.value)
"""


def other_process_writes(target: str, manifest: Path, key: str) -> None:
    """Another process appends within 3 s (its busy/lock timeout): nothing holds the write lock."""
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, target, str(manifest), key],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "received", done.stderr


def sound(target: str, events: int) -> None:
    """A fresh handle verifies the ledger and finds exactly `events` events."""
    with Ledger.open(target) as ledger:
        report = verify(ledger.store)
        assert report["ok"], report
        assert ledger.store.count_events() == events


@pytest.fixture
def ledger(ws: Workspace) -> Iterator[Ledger]:
    with ws.ledger(busy_timeout=3) as led:
        led.init(event_id="i/init")
        led.activate_baseline(ws.baseline(), event_id="i/base")
        led.receive(ws.dpo("dpo-0"), event_id="i/recv-0")
        yield led


# --- SQLite: the interrupt lands exactly after BEGIN ----------------------------------------------------


def _receive(ledger: Ledger, ws: Workspace) -> None:
    ledger.receive(ws.dpo("dpo-1"), event_id="i/recv-1")


def _settings(ledger: Ledger, ws: Workspace) -> None:
    ledger.advance_window(2, event_id="i/window-2")  # a settings command: `store.transaction()`


def _checkpoint(ledger: Ledger, ws: Workspace) -> None:
    take_checkpoint(ledger.store, clock=lambda: "2026-12-02T00:00:00.000000Z")  # the store's `_write()`


def _snapshot(ledger: Ledger, ws: Workspace) -> None:
    assert verify(ledger.store)["ok"]  # verify reads inside `read_snapshot()`


@pytest.mark.parametrize(
    ("run", "after", "appended"),
    [
        (_receive, "BEGIN IMMEDIATE", 1),
        (_settings, "BEGIN IMMEDIATE", 1),
        (_checkpoint, "BEGIN IMMEDIATE", 0),
        (_snapshot, "BEGIN", 0),
    ],
    ids=["append", "transaction", "maintenance", "read-snapshot"],
)
def test_an_interrupt_right_after_begin_leaves_the_ledger_usable(
    ledger: Ledger, ws: Workspace, run: Callable[[Ledger, Workspace], None], after: str, appended: int
) -> None:
    store = ledger.store
    assert isinstance(store, SQLiteEventStore)
    before = store.count_events()
    wrapped = store._conn = Interrupting(store._conn, after=after)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        run(ledger, ws)
    assert wrapped.fired == 1 and not wrapped.in_transaction  # rolled back: the lock is free
    assert store.count_events() == before  # nothing half-written
    other_process_writes(str(ws.db), ws.dpo("dpo-other"), "other/recv")
    run(ledger, ws)  # the same call again, on the same Ledger: it works
    assert ledger.receive(ws.dpo("dpo-2"), event_id="i/recv-2").state is State.RECEIVED
    sound(str(ws.db), before + 1 + appended + 1)


def test_a_second_interrupt_in_the_rollback_is_ended_by_the_next_call(ledger: Ledger, ws: Workspace) -> None:
    """Ctrl-C just before COMMIT, and again before the handler's ROLLBACK ran: the transaction, its
    row and the write lock stay open in the supervisor's process. The next call on the same store
    rolls it back first: a read never sees the uncommitted row, then another process can write."""
    store = ledger.store
    assert isinstance(store, SQLiteEventStore)
    before = store.count_events()
    wrapped = store._conn = Interrupting(store._conn, refuse=("COMMIT", "ROLLBACK"))  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        _receive(ledger, ws)
    assert wrapped.fired == 2 and wrapped.in_transaction  # left open: the row inserted, the lock held
    assert store.count_events() == before  # the next call (a read) ends it first
    assert not wrapped.in_transaction
    other_process_writes(str(ws.db), ws.dpo("dpo-other"), "other/recv")
    _receive(ledger, ws)
    sound(str(ws.db), before + 2)


def test_a_write_through_the_store_inside_its_own_transaction_is_refused(tmp_path: Path) -> None:
    """What the next call must not mistake for a leftover: a write through the store while one of its
    own blocks holds the transaction is refused (both transactions stay whole), on SQLite as on PostgreSQL."""
    with SQLiteEventStore(tmp_path / "n.db", synchronous="NORMAL") as store:
        with store.transaction() as tx:
            tx.append("a", 0, [new("a", 0)])
            with pytest.raises(InputError, match="inside its own open transaction"):
                store.append("b", 0, [new("b", 0)])
            with pytest.raises(InputError, match="inside a write transaction"), store.read_snapshot():
                pass
            tx.append("a", 1, [new("a", 1)])
        assert [e.version for e in store.read_stream("a")] == [1, 2] and store.read_stream("b") == []


# --- PostgreSQL: the same windows, psycopg's `execute` wrapped -------------------------------------------


def interrupt_after(conn: psycopg.Connection[Any], prefix: str, *, then_refuse: str = "") -> list[str]:
    """Make `conn.execute` raise KeyboardInterrupt once right after a statement starting with `prefix` ran
    (and, with `then_refuse`, once instead of running the next statement starting with it)."""
    real = conn.execute
    fired: list[str] = []

    def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
        text = str(query)
        if then_refuse and fired and text.startswith(then_refuse) and len(fired) == 1:
            fired.append(text)
            raise KeyboardInterrupt
        cursor = real(query, *args, **kwargs)
        if not fired and text.startswith(prefix):
            fired.append(text)
            raise KeyboardInterrupt
        return cursor

    conn.execute = execute  # type: ignore[method-assign]
    return fired


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresEventStore]:
    with PostgresEventStore(pg_url, synchronous="NORMAL", busy_timeout=3) as s:
        s.append("a", 0, [new("a", 0), new("a", 1)])
        yield s


def committed(pg_url: str) -> int:
    """Events another session sees (committed ones only)."""
    return int(pg_execute(pg_url, "SELECT count(*) FROM events")[0][0])


@pytest.mark.postgres
@pytest.mark.parametrize("refuse_rollback", [False, True], ids=["interrupt", "then-again-in-the-rollback"])
def test_pg_an_interrupt_right_after_a_snapshot_begins_leaves_no_transaction(
    pg_store: PostgresEventStore, pg_url: str, refuse_rollback: bool
) -> None:
    """Before: the REPEATABLE READ transaction stayed open, so the next append ran inside it (refused: read
    only) and every read saw the old snapshot. Now it is ended at once, or (a second interrupt before the
    ROLLBACK) by the next call; that append is committed, other sessions see it."""
    fired = interrupt_after(pg_store.session.conn, "BEGIN ISOLATION", then_refuse="ROLLBACK" if refuse_rollback else "")
    with pytest.raises(KeyboardInterrupt), pg_store.read_snapshot():
        pass
    assert len(fired) == (2 if refuse_rollback else 1)
    pg_store.append("a", 2, [new("a", 2)])
    assert committed(pg_url) == 3
    with pg_store.read_snapshot():
        assert pg_store.count_events() == 3
    assert verify_chain(pg_store).ok


@pytest.mark.postgres
def test_pg_an_interrupt_once_the_maintenance_lock_is_taken_releases_it(
    pg_store: PostgresEventStore, pg_url: str
) -> None:
    """A checkpoint interrupted right after BEGIN and the lock: rolled back, another session appends at once."""
    fired = interrupt_after(pg_store.session.conn, "BEGIN; SELECT pg_advisory_xact_lock")
    with pytest.raises(KeyboardInterrupt):
        pg_store.append_checkpoint(position=2, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    assert fired and pg_store.session.conn.pgconn.transaction_status == 0
    with PostgresEventStore(pg_url, synchronous="NORMAL", busy_timeout=2) as other:
        other.append("b", 0, [new("b", 0)])
    assert list(pg_store.select_checkpoints()) == []
    pg_store.append_checkpoint(position=3, schema_version=1, fingerprint="f", snapshot="{}", recorded_at="t")
    assert committed(pg_url) == 3 and verify_chain(pg_store).ok


@pytest.mark.postgres
def test_pg_a_session_left_with_answers_unread_is_replaced(pg_store: PostgresEventStore) -> None:
    """A query sent and its answer never read (an interrupt between the two): every later call failed
    "another command is already in progress". Now the next call closes that session (the server rolls back
    what it had not committed) and opens a new one."""
    pg_store.session.conn.pgconn.send_query(b"SELECT pg_sleep(0.05)")
    assert pg_store.session.conn.pgconn.transaction_status == 1  # ACTIVE: an answer unread
    assert pg_store.head().seq == 2
    assert pg_store.session.reconnects == 1
    pg_store.append("a", 2, [new("a", 2)])
    assert verify_chain(pg_store).ok


# --- real signals: a supervisor process that SIGINTs itself -------------------------------------------

_SUPERVISOR = """
import json, sys
from lifecycle_fsm import Ledger
target, sft, first, second = sys.argv[1:5]
ledger = Ledger.open(target, actor="sup", busy_timeout=5, synchronous="NORMAL")
ledger.init(event_id="s/init")
ledger.activate_baseline(sft, event_id="s/base")
print(ledger.store.count_events(), flush=True)
try:
    ledger.receive(first, event_id="s/first")  # the third command: LIFECYCLE_FAULT=int@POINT#3
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
sys.stdin.readline()  # idle, its Ledger open, while another process writes
again = ledger.receive(first, event_id="s/first")  # what a supervisor does next: the keyed retry
after = ledger.receive(second, event_id="s/second")
print(json.dumps({"again": [again.state.value, again.duplicate], "after": after.state.value}), flush=True)
sys.stdin.readline()  # still running, its Ledger open, while another process writes
ledger.close()
print("closed", flush=True)
"""


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("point", ["after_begin", "before_commit", "after_commit"])
def test_a_real_sigint_caught_by_the_supervisor_leaves_its_ledger_usable(
    ws: Workspace, request: pytest.FixtureRequest, backend: str, point: str
) -> None:
    target = str(ws.db) if backend == "sqlite" else request.getfixturevalue("pg_url")
    sft, first, second = ws.baseline(), ws.dpo("dpo-first"), ws.dpo("dpo-second")
    with subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR, target, str(sft), str(first), str(second)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), ENV_VAR: f"int@{point}#3"},
    ) as child:
        assert child.stdout is not None and child.stdin is not None and child.stderr is not None
        try:
            base = int(child.stdout.readline())
            assert child.stdout.readline().strip() == "interrupted"
            other_process_writes(target, ws.dpo("dpo-other"), "other/recv")  # the lock is free at once
            child.stdin.write("\n")
            child.stdin.flush()
            outcome = json.loads(child.stdout.readline())
            # Committed before the interrupt (after_commit): the retry answers what it did; else it appends now.
            assert outcome == {"again": ["received", point == "after_commit"], "after": "received"}
            other_process_writes(target, ws.dpo("dpo-more"), "other/more")  # and after its next commands
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "closed"
            assert child.wait(60) == 0
        except BaseException:
            child.kill()
            print(child.stderr.read())
            raise
    sound(target, base + 4)  # the supervisor's two receives (the first once) and the other process's two


# --- a storm of real SIGINTs, anywhere inside the commands ---------------------------------------------

_STORM = """
import json, os, random, signal, sys, threading, time
from lifecycle_fsm import Ledger
target, spec, low, high = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
armed = False
interrupts = 0

def on_sigint(signum, frame):  # Ctrl-C only inside a command: the loop below must survive to retry it
    if armed:
        raise KeyboardInterrupt

signal.signal(signal.SIGINT, on_sigint)
ledger = Ledger.open(target, actor="storm", busy_timeout=5, synchronous="NORMAL")

def step(fn, *args, **kwargs):  # a supervisor's loop: an interrupted keyed command is run again
    global armed, interrupts
    while True:
        try:
            armed = True
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            interrupts += 1
        finally:
            armed = False

stop = threading.Event()
def storm():  # ends after 200 hits: on a loaded host a command slower than the interval never finished
    rnd = random.Random(7)
    while interrupts < 200 and not stop.wait(rnd.uniform(low, high)):
        if armed:  # aimed at a command (one landing between two is ignored): a loaded host still gets hits
            os.kill(os.getpid(), signal.SIGINT)

if high > 0:
    threading.Thread(target=storm, daemon=True).start()
step(ledger.init, event_id="s/init")
step(ledger.activate_baseline, spec["sft"], event_id="s/base")
for n, (manifest, saved) in enumerate(spec["candidates"]):
    cid = step(ledger.receive, manifest, event_id=f"s/{n}/receive").candidate_id
    step(ledger.record_trusted_state, cid, "trajectories", saved, event_id=f"s/{n}/trusted")
    step(ledger.fail_stage, cid, "reward", event_id=f"s/{n}/fail")
    step(ledger.complete_recovery, cid, event_id=f"s/{n}/recovered")
    step(ledger.check, cid, event_id=f"s/{n}/check")
    step(ledger.hand_off, cid, event_id=f"s/{n}/handoff")
stop.set()
states = sorted({str(ledger.candidate(c).state) for c in ledger.candidate_ids()})
print(json.dumps({"interrupts": interrupts, "states": states, "events": ledger.store.count_events()}), flush=True)
ledger.close()
"""


def _storm(target: str, spec: dict[str, Any], low: float, high: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _STORM, target, json.dumps(spec), str(low), str(high)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "low", "high"),
    [("sqlite", 0.001, 0.01), pytest.param("postgres", 0.003, 0.02, marks=pytest.mark.postgres)],
)
def test_a_storm_of_sigints_inside_commands_loses_and_doubles_nothing(
    ws: Workspace, tmp_path: Path, request: pytest.FixtureRequest, backend: str, low: float, high: float
) -> None:
    """SIGINT every few milliseconds, landing anywhere inside the commands of a supervisor that runs each
    interrupted keyed command again: every command lands exactly once (the same events as a quiet run),
    the chain verifies, and another process can write afterwards."""
    saved = tmp_path / "saved" / "trajectories"
    saved.mkdir(parents=True)
    (saved / "state.bin").write_bytes(b"trajectories" * 100)
    spec = {"sft": str(ws.baseline()), "candidates": [(str(ws.grpo(f"grpo-{n}")), str(saved)) for n in range(8)]}
    quiet = _storm(str(tmp_path / "quiet.db"), spec, 0, 0)
    target = str(ws.db) if backend == "sqlite" else request.getfixturevalue("pg_url")
    stormy = _storm(target, spec, low, high)
    assert stormy["interrupts"] >= 3, stormy  # the storm did land inside commands (how often: the machine's load)
    assert (stormy["states"], stormy["events"]) == (quiet["states"], quiet["events"])
    other_process_writes(target, ws.dpo("dpo-other"), "other/recv")
    sound(target, quiet["events"] + 1)
