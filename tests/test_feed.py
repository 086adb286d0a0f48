"""Reading the log as it grows: `events`, `follow`, `wait_for`, with a real second process writing.

Each cross-process test runs on SQLite and PostgreSQL: a writer process appends while
this one follows or waits, and what it sees must be every event, in seq order, once.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lifecycle_fsm import FeedEvent, InputError, Ledger, LedgerClosedError, LifecycleError, State, WaitTimeout
from lifecycle_fsm.candidate_events import CandidateReceived, ChecksRecorded
from lifecycle_fsm.events import LedgerInitialized
from lifecycle_fsm.store.base import event_at
from tests.conftest import REPO, Workspace

WRITER = """
import sys, time
from lifecycle_fsm import Ledger
target, manifest, n, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with Ledger.open(target, actor="writer") as ledger:
    time.sleep(pause)
    ledger.receive(manifest)
    ledger.check("dpo-v5")
    for i in range(n):
        path = f"{manifest}.queue-{i}"
        open(path, "w").write(str(i))
        ledger.record_trusted_state("dpo-v5", "prompt_queue", path)
"""


def _target(ws: Workspace, backend: str, request: pytest.FixtureRequest) -> str:
    return str(ws.db) if backend == "sqlite" else str(request.getfixturevalue("pg_url"))


def _writer(target: str, manifest: Path, n: int, pause: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, target, str(manifest), str(n), str(pause)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _setup(target: str, ws: Workspace) -> Path:
    with Ledger.open(target, actor="setup") as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
    return ws.dpo()


def test_events_catch_up_in_seq_order_with_decoded_events(ws: Workspace, ledger: Ledger) -> None:
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    ledger.check("dpo-v5")
    events = list(ledger.events())
    assert [e.seq for e in events] == list(range(1, 5))
    first = events[0]
    assert isinstance(first, FeedEvent) and isinstance(first.event, LedgerInitialized)
    assert (first.stream_id, first.version, first.type) == ("ledger", 1, "LedgerInitialized")
    assert first.hash == event_at(ledger.store, 1).hash and first.actor == ledger.actor  # type: ignore[union-attr]
    assert first.recorded_at.endswith("Z")
    assert [type(e.event) for e in ledger.events(after=2)] == [CandidateReceived, ChecksRecorded]
    assert [e.seq for e in ledger.events(stream="dpo-v5")] == [3, 4]
    assert [e.type for e in ledger.events(stream="ledger")] == ["LedgerInitialized", "BaselineActivated"]
    assert list(ledger.events(after=4)) == []


def test_events_pages_through_a_long_log(ws: Workspace, ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """More events than one page: none lost or repeated at the page boundaries."""
    from lifecycle_fsm import feed

    monkeypatch.setattr(feed, "PAGE", 3)
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    for i in range(7):
        path = ws.root / f"q{i}"
        path.write_text(str(i))
        ledger.record_trusted_state("dpo-v5", "prompt_queue", path)
    assert [e.seq for e in ledger.events()] == list(range(1, 11))
    assert [e.seq for e in ledger.events(after=3, stream="dpo-v5")] == list(range(4, 11))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_follow_sees_every_event_another_process_appends(
    ws: Workspace, backend: str, request: pytest.FixtureRequest
) -> None:
    target = _target(ws, backend, request)
    manifest = _setup(target, ws)
    n = 40
    stop = threading.Event()
    guard = threading.Timer(90, stop.set)  # a hung follow fails the test instead of hanging it
    guard.start()
    seen: list[FeedEvent] = []
    with Ledger.open(target, actor="follower") as follower:
        start = follower.store.head().seq
        writer = _writer(target, manifest, n, 0.3)
        for event in follower.follow(after=start, poll=0.02, stop=stop):
            seen.append(event)
            if len(seen) == n + 2:
                stop.set()
    guard.cancel()
    _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert [e.seq for e in seen] == list(range(start + 1, start + n + 3))
    assert [e.type for e in seen[:2]] == ["CandidateReceived", "ChecksRecorded"]
    assert {e.actor for e in seen} == {"writer"}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_wait_for_returns_once_another_process_moves_the_candidate(
    ws: Workspace, backend: str, request: pytest.FixtureRequest
) -> None:
    """The candidate does not exist yet when the wait starts: another process receives and checks it."""
    target = _target(ws, backend, request)
    manifest = _setup(target, ws)
    with Ledger.open(target, actor="waiter") as waiter:
        writer = _writer(target, manifest, 0, 0.5)
        state = waiter.wait_for("dpo-v5", [State.VERIFIED, "reject"], timeout=60, poll=0.05)
    _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert state is State.VERIFIED


def test_wait_for_times_out_with_a_lifecycle_and_builtin_timeout_error(ws: Workspace, ledger: Ledger) -> None:
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        ledger.wait_for("dpo-v5", ["ready"], timeout=0.3, poll=0.05)
    assert time.monotonic() - started >= 0.3
    error = info.value
    assert isinstance(error, LifecycleError) and isinstance(error, TimeoutError)
    assert (error.candidate_id, error.states, error.last_state) == ("dpo-v5", ("ready",), "received")
    assert ledger.wait_for("dpo-v5", ["received"], timeout=0) is State.RECEIVED  # already there: no wait
    with pytest.raises(ValueError, match="nowhere"):
        ledger.wait_for("dpo-v5", ["nowhere"], timeout=1)


def test_wait_for_a_rejected_candidate_ends_at_once(ws: Workspace, ledger: Ledger) -> None:
    """Reject is terminal: a wait for ready on a rejected candidate is answered now, not after its timeout."""
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo(source_policy_version="sft-v0"))
    assert ledger.check("dpo-v5").state is State.REJECT
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match="reject is terminal") as info:
        ledger.wait_for("dpo-v5", ["ready"], timeout=60)
    assert time.monotonic() - started < 5 and info.value.last_state == "reject"
    assert ledger.wait_for("dpo-v5", ["ready", "reject"], timeout=60) is State.REJECT


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_close_from_another_thread_ends_a_long_wait_for(
    ws: Workspace, request: pytest.FixtureRequest, backend: str
) -> None:
    target = _target(ws, backend, request)
    _setup(target, ws)
    ledger = Ledger.open(target)
    closer = threading.Timer(0.3, ledger.close)
    closer.start()
    started = time.monotonic()
    with pytest.raises(LedgerClosedError):
        ledger.wait_for("dpo-v5", ["ready"], timeout=60, poll=30)
    closer.join()
    assert time.monotonic() - started < 3, time.monotonic() - started


def test_wait_for_on_postgres_wakes_on_a_commit_not_the_poll(ws: Workspace, pg_url: str) -> None:
    """With a poll of 60 s, a waiter sees another process's check promptly: the commit's NOTIFY wakes it."""
    manifest = _setup(pg_url, ws)
    with Ledger.open(pg_url, actor="waiter") as waiter:
        writer = _writer(pg_url, manifest, 0, 1.0)
        started = time.monotonic()
        state = waiter.wait_for("dpo-v5", [State.VERIFIED, "reject"], timeout=90, poll=60)
        waited = time.monotonic() - started
    _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert state is State.VERIFIED and waited < 45  # well under one 60 s poll


STATE_NAMES = "received, verified, recovering, tune, reject, ready"


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (["readyy"], f"wait_for: 'readyy' is not a state (expected one of {STATE_NAMES})"),
        ([], f"wait_for needs at least one state (one of {STATE_NAMES})"),
        ([State.READY, 5], f"wait_for: 5 is not a state (expected one of {STATE_NAMES})"),
        (["READY"], f"wait_for: 'READY' is not a state (expected one of {STATE_NAMES})"),
        (5, "wait_for: states must be a state or an iterable of states, not int"),
        (None, "wait_for: states must be a state or an iterable of states, not NoneType"),
    ],
)
def test_bad_states_are_one_line_input_errors(ledger: Ledger, states: object, message: str) -> None:
    """A name that is no state, no state at all or not states: an InputError in the LifecycleError tree
    (was a bare ValueError, "'readyy' is not a valid State"), before any wait."""
    started = time.monotonic()
    with pytest.raises(InputError) as info:
        ledger.wait_for("dpo-v5", states, timeout=30)  # type: ignore[arg-type]
    assert isinstance(info.value, LifecycleError)
    assert str(info.value) == message
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("one", ["received", State.RECEIVED])
def test_one_state_given_alone_is_that_state_not_its_characters(ws: Workspace, ledger: Ledger, one: str) -> None:
    """`wait_for(id, "ready", t)` waits for `ready` (it iterated the string: "'r' is not a valid State")."""
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    assert ledger.wait_for("dpo-v5", one, timeout=0) is State.RECEIVED
    with pytest.raises(WaitTimeout) as info:
        ledger.wait_for("dpo-v5", "ready", timeout=0.1, poll=0.05)
    assert info.value.states == ("ready",)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_waiter_that_needs_an_existing_ledger_fails_at_once_on_a_mistyped_one(
    ws: Workspace, backend: str, request: pytest.FixtureRequest
) -> None:
    """`Ledger.open(..., create=False)`: a mistyped path (or an empty schema) is an InputError at
    once, instead of a new empty ledger the waiter would watch for its whole timeout."""
    if backend == "sqlite":
        target = str(ws.root / "ledgr.db")
    else:
        target = str(request.getfixturevalue("pg_url"))
    started = time.monotonic()
    with pytest.raises(InputError, match="no ledger at"):
        Ledger.open(target, create=False)
    assert time.monotonic() - started < 30
    if backend == "sqlite":
        assert not (ws.root / "ledgr.db").exists()
    else:
        from tests.backends import pg_execute

        assert pg_execute(target, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()") == [(0,)]
    target = _target(ws, backend, request)
    manifest = _setup(target, ws)  # once it exists, create=False opens it like any ledger
    with Ledger.open(target, create=False) as waiter:
        writer = _writer(target, manifest, 0, 0.2)
        assert waiter.wait_for("dpo-v5", State.VERIFIED, timeout=60, poll=0.05) is State.VERIFIED
    _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err


def test_follow_ends_when_the_ledger_is_closed(ws: Workspace) -> None:
    ledger = ws.ledger()
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    seen = []
    for event in ledger.follow(after=0, poll=0.01):
        seen.append(event.seq)
        ledger.close()
    assert seen == [1]


def test_close_from_another_thread_ends_a_blocked_follow(ws: Workspace) -> None:
    """A supervisor's shutdown handler closes the ledger its main thread follows: the follow ends at its next
    wake, the opening thread closes the connection, and every later call is LedgerClosedError."""
    ledger = ws.ledger()
    ledger.init()
    store = ledger.store
    seen: list[int] = []
    closer = threading.Timer(0.3, ledger.close)
    closer.start()
    started = time.monotonic()
    seen.extend(event.seq for event in ledger.follow(after=0, poll=0.05))
    closer.join()
    assert seen == [1] and ledger.closed and time.monotonic() - started < 5
    with pytest.raises(LedgerClosedError):
        ledger.settings()
    with pytest.raises(LifecycleError, match="closed"):
        store.head()  # the connection itself was closed by this thread, at the follow's end


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("how", ["stop", "close"])
def test_a_long_poll_does_not_delay_a_shutdown(
    ws: Workspace, request: pytest.FixtureRequest, backend: str, how: str
) -> None:
    """A follower waiting out a 30 s poll notices `stop`, or `close()` from another thread, within a second."""
    target = _target(ws, backend, request)
    _setup(target, ws)
    ledger = Ledger.open(target)
    stop = threading.Event()
    ender = threading.Timer(0.3, stop.set if how == "stop" else ledger.close)
    ender.start()
    started = time.monotonic()
    try:
        seen = [event.seq for event in ledger.follow(after=0, poll=30, stop=stop)]
    finally:
        ender.join()
        ledger.close()
    assert seen and time.monotonic() - started < 3, time.monotonic() - started


def test_follow_on_postgres_wakes_on_a_commit_not_the_poll(ws: Workspace, pg_url: str) -> None:
    """With a poll of 60 s, a follower still sees another process's events promptly: NOTIFY wakes it."""
    manifest = _setup(pg_url, ws)
    stop = threading.Event()
    guard = threading.Timer(90, stop.set)
    guard.start()
    with Ledger.open(pg_url, actor="follower") as follower:
        start = follower.store.head().seq
        writer = _writer(pg_url, manifest, 0, 1.0)
        started = time.monotonic()
        seen = []
        for event in follower.follow(after=start, poll=60, stream="dpo-v5", stop=stop):
            seen.append(event.type)
            if len(seen) == 2:
                break
        waited = time.monotonic() - started
    guard.cancel()
    _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert seen == ["CandidateReceived", "ChecksRecorded"]
    assert waited < 45  # well under one 60 s poll: the commits woke it


NAN_WAIT = """
import math, sys
from lifecycle_fsm import InputError, Ledger
with Ledger.open(sys.argv[1]) as ledger:
    calls = {
        "timeout nan": lambda: ledger.wait_for("dpo-v5", ["ready"], math.nan),
        "timeout inf": lambda: ledger.wait_for("dpo-v5", ["ready"], math.inf),
        "timeout -1": lambda: ledger.wait_for("dpo-v5", ["ready"], -1),
        "timeout 1e300": lambda: ledger.wait_for("dpo-v5", ["ready"], 1e300),
        "timeout True": lambda: ledger.wait_for("dpo-v5", ["ready"], True),
        "timeout '1'": lambda: ledger.wait_for("dpo-v5", ["ready"], "1"),
        "poll nan": lambda: ledger.wait_for("dpo-v5", ["ready"], 1, poll=math.nan),
        "poll 0": lambda: ledger.wait_for("dpo-v5", ["ready"], 1, poll=0),
        "poll -1": lambda: ledger.wait_for("dpo-v5", ["ready"], 1, poll=-1),
        "follow poll nan": lambda: ledger.follow(0, poll=math.nan),
        "follow poll inf": lambda: ledger.follow(0, poll=math.inf),
        "follow poll 0": lambda: ledger.follow(0, poll=0),
        "follow poll -1": lambda: ledger.follow(0, poll=-1.0),
        "follow poll 1e300": lambda: ledger.follow(0, poll=1e300),
    }
    for name, call in calls.items():
        try:
            call()
        except InputError as e:
            print(f"{name}: InputError: {e}")
        else:
            print(f"{name}: accepted")
"""


def test_a_nan_infinite_or_negative_timeout_or_poll_is_an_input_error(ws: Workspace, ledger: Ledger) -> None:
    """`wait_for(id, ["ready"], nan)` never returned (nan never passes); `follow(poll=nan)` spun.

    Run in a subprocess with a timeout, so the hang comes back as a failure, not a stuck suite.
    """
    ledger.init()
    result = subprocess.run(
        [sys.executable, "-c", NAN_WAIT, str(ws.db)], cwd=REPO, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 14 and all(": InputError: " in line for line in lines), result.stdout


def test_a_zero_timeout_still_looks_once_and_times_out(ws: Workspace, ledger: Ledger) -> None:
    """0 keeps its meaning (look once); an int timeout and poll are fine."""
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    with pytest.raises(WaitTimeout, match="within 0 s"):
        ledger.wait_for("dpo-v5", ["ready"], 0, poll=1)
    assert ledger.wait_for("dpo-v5", ["received"], 5, poll=1) is State.RECEIVED


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("stop", [True, "stop", 0, asyncio.Event()], ids=["True", "'stop'", "0", "asyncio.Event"])
def test_a_stop_that_is_no_event_is_an_input_error_when_follow_is_called(
    ws: Workspace, backend: str, request: pytest.FixtureRequest, stop: object
) -> None:
    """It was `'bool' object has no attribute 'is_set'` at the first poll; an asyncio.Event (whose
    `wait` takes no timeout and must be awaited) failed on SQLite at the first empty poll and was
    polled on PostgreSQL: two backends, two behaviours."""
    with Ledger.open(_target(ws, backend, request)) as ledger:
        ledger.init()
        with pytest.raises(InputError, match="stop"):
            ledger.follow(after=0, poll=0.01, stop=stop)  # type: ignore[arg-type]


def test_a_stop_with_is_set_and_wait_is_honoured(ws: Workspace, ledger: Ledger) -> None:
    """Duck-typed events (a multiprocessing one) still work, as before."""
    stop = multiprocessing.get_context("spawn").Event()
    ledger.init()
    seen = []
    for event in ledger.follow(after=0, poll=0.01, stop=stop):
        seen.append(event.seq)
        stop.set()
    assert seen == [1]
