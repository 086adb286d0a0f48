"""Commands decided from the reader's cache without reading the store (SPEC §5, §9).

A Ledger keeps the folds of the streams it last read or wrote and decides a command
from them; its append asserts the version of every stream it decided from. These
tests make the cache stale on purpose: another Ledger on the same file, and two real
processes taking turns on one candidate (SQLite and PostgreSQL). A stale cache must
never append a decision (no lost update, versions contiguous, the chain verifies), and
a refusal or a no-op decided from the cache must be checked against the log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import structlog

from lifecycle_fsm import InputError, Ledger, State
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.replay.checkpoints import load_state
from lifecycle_fsm.replay.verify import verify
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.streams import fold_candidate
from tests.conftest import REPO, Workspace

WORKER = REPO / "tests" / "alternate_worker.py"


@contextmanager
def traced(store: object) -> Iterator[list[str]]:
    """Every statement the SQLite store runs meanwhile."""
    assert isinstance(store, SQLiteEventStore)
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        store._conn.set_trace_callback(None)


@pytest.fixture
def two(ws: Workspace) -> Iterator[tuple[Ledger, Ledger]]:
    """Two Ledgers on one SQLite file, each with its own connection and cache."""
    with Ledger.open(ws.db, synchronous="NORMAL", actor="one") as one, Ledger.open(ws.db, actor="two") as two:
        one.init()
        one.activate_baseline(ws.baseline())
        yield one, two


def test_a_command_on_a_cached_candidate_reads_no_stream(ws: Workspace, two: tuple[Ledger, Ledger]) -> None:
    """The second command on a candidate this Ledger wrote reads neither its stream nor the ledger's."""
    one, _ = two
    one.receive(ws.dpo())
    one.settings()
    with traced(one.store) as statements:
        assert one.check("dpo-v5").state == "verified"
    reads = [s for s in statements if "FROM events WHERE stream_id" in s and "version >" in s]
    assert reads == [], reads
    assert any("INTO events (" in s for s in statements)


def test_a_candidate_invalidated_by_a_fan_out_stays_cached(ws: Workspace, two: tuple[Ledger, Ledger]) -> None:
    """The window change's EvidenceInvalidated is folded into the cache: the next check reads nothing."""
    one, _ = two
    one.receive(ws.grpo())
    assert one.check("grpo-v7").state == "verified"
    assert one.advance_window(2).invalidated == ("grpo-v7",)
    with traced(one.store) as statements, structlog.testing.capture_logs() as logs:
        one.check("grpo-v7")
    assert not [s for s in statements if "FROM events WHERE stream_id" in s and "version >" in s]
    assert not [entry for entry in logs if entry["event"] in ("command_retried", "command_reread")]
    assert [e.version for e, _ in one.history("grpo-v7")] == [1, 2, 3, 4]


def test_a_refusal_from_a_stale_cache_is_checked_against_the_log(ws: Workspace, two: tuple[Ledger, Ledger]) -> None:
    """`one` last saw the candidate received (where `recovered` is refused); `two` failed it since."""
    one, two_ = two
    one.receive(ws.grpo())
    two_.fail_stage("grpo-v7", "sampling")
    with structlog.testing.capture_logs() as logs:
        result = one.complete_recovery("grpo-v7")
    assert result.state == "received" and result.candidate is not None and result.candidate.version == 4
    assert not [entry for entry in logs if entry["event"] == "command_retried"]  # re-read, not a lost race


def test_a_noop_from_a_stale_cache_is_checked_against_the_log(ws: Workspace, two: tuple[Ledger, Ledger]) -> None:
    """`one` last saw baseline 1 active (activating it again: nothing); `two` activated baseline 2 since."""
    one, two_ = two
    first = ws.baseline()
    one.activate_baseline(first)
    two_.activate_baseline(ws.baseline("sft-v2"))
    result = one.activate_baseline(first)
    assert len(result.events) == 1 and result.settings is not None
    assert result.settings.active_policy_version == ws.sft_sha
    assert two_.settings().active_policy_version == ws.sft_sha


def test_a_stale_cached_decision_is_redecided_without_backoff(ws: Workspace, two: tuple[Ledger, Ledger]) -> None:
    """`one` decides from its cache, the append refuses (`two` wrote meanwhile), it re-reads and appends."""
    one, two_ = two
    one.receive(ws.grpo())
    queue, trajectories = ws.root / "queue.jsonl", ws.root / "trajectories.jsonl"
    queue.write_text("q\n")
    trajectories.write_text("t\n")
    two_.record_trusted_state("grpo-v7", "prompt_queue", queue)
    with structlog.testing.capture_logs() as logs:
        result = one.record_trusted_state("grpo-v7", "trajectories", trajectories)
    assert [(entry["cached"], entry["conflict_stream"]) for entry in logs if entry["event"] == "command_retried"] == [
        (True, "candidate:grpo-v7")
    ]
    assert result.candidate is not None and sorted(result.candidate.trusted_states) == ["prompt_queue", "trajectories"]
    assert [e.version for e, _ in one.history("grpo-v7")] == [1, 2, 3]


def _turns(ws: Workspace) -> list[dict[str, Any]]:
    """Commands on one candidate, taken in turn by two processes: each finds its cache stale."""
    files = ws.root / "states"
    files.mkdir()
    turns: list[dict[str, Any]] = [{"command": "receive", "manifest": str(ws.grpo())}]
    for n in range(12):
        path = files / f"{n}.jsonl"
        path.write_text(f"{n}\n")
        kind = ("prompt_queue", "trajectories")[n % 2]
        turns.append({"command": "trusted", "kind": kind, "path": str(path)})
        if n % 4 == 1:
            turns.append({"command": "fail", "stage": "sampling"})  # the other process then recovers
            turns.append({"command": "recovered"})  # its cache says received: refused there, allowed in the log
        if n % 4 == 3:
            turns.append({"command": "check"})
        if n == 6:
            turns.append({"command": "window", "window": 2})
    return [{**t, "candidate": "grpo-v7"} for t in turns]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_processes_taking_turns_lose_no_update(ws: Workspace, request: pytest.FixtureRequest, backend: str) -> None:
    target = str(ws.db) if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    with Ledger.open(target, actor="setup", synchronous="NORMAL") as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), target, name],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    answers: list[dict[str, Any]] = []
    kinds: list[str] = []
    versions: list[int] = []  # the candidate's version before each turn
    version = 0
    try:
        for n, turn in enumerate(_turns(ws)):
            proc = procs[n % 2]
            assert proc.stdin is not None and proc.stdout is not None
            versions.append(version)
            proc.stdin.write(json.dumps(turn) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            assert line, proc.communicate(timeout=60)[1]
            answer = json.loads(line)
            own = [v for stream, v in answer["appended"] if stream == "candidate:grpo-v7"]
            assert own == list(range(version + 1, version + 1 + len(own))), (turn, answer)  # nothing lost, no gap
            if answer["version"] is not None:
                version = answer["version"]
                assert own and own[-1] == version
            else:  # a settings command: its fan-out may have invalidated the candidate
                version = own[-1] if own else version
            answers.append(answer)
            kinds.append(turn["command"])
    finally:
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
    # Whenever the other process moved the candidate since a process's last turn, that
    # process's cache was stale on it: each time, it was noticed (refused append or re-read).
    seen = {0: 0, 1: 0}
    for n, (kind, answer, before) in enumerate(zip(kinds, answers, versions, strict=True)):
        if kind != "window" and seen[n % 2] and before > seen[n % 2]:
            assert answer["stale"] + answer["reread"] >= 1, (n, kind, answer)
        seen[n % 2] = versions[n + 1] if n + 1 < len(versions) else version
    assert sum(a["stale"] for a in answers) >= 8 and sum(a["reread"] for a in answers) >= 2
    with Ledger.open(target, actor="auditor") as ledger:
        history = ledger.history("grpo-v7")
        assert [e.version for e, _ in history] == list(range(1, version + 1))
        trusted = [e for e, _ in history if e.type == "TrustedStateRecorded"]
        assert len(trusted) == 12
        report = verify(ledger.store)
        assert report["ok"], report
        replayed = load_state(ledger.store, use_checkpoints=False).state
        assert replayed.candidates["grpo-v7"] == ledger.candidate("grpo-v7")


def _stream_reads(statements: list[str]) -> list[str]:
    """The reads of a stream's events (not the append's version check)."""
    return [s for s in statements if "FROM events WHERE stream_id" in s and "version >" in s]


def test_the_candidate_cache_stays_at_its_bound_and_an_evicted_candidate_is_answered_from_the_log(
    ws: Workspace,
) -> None:
    """A Ledger holds at most `cached_candidates` folds, least recently used evicted first (it grew
    without bound: ~7 KB per candidate ever touched). An evicted candidate is read again, and every
    answer about it is the log's, even after another process moved it; a working set within the
    bound is still decided without reading a stream."""
    names = [f"dpo-{i}" for i in range(6)]
    with ws.ledger(cached_candidates=3) as ledger, ws.ledger() as other:
        ledger.activate_baseline(ws.baseline())
        manifests = {name: ws.dpo(name) for name in names}
        for name in names:
            ledger.receive(manifests[name])
        reader = ledger._reader
        assert reader.held == 3
        assert [n for n in names if reader.cached(stream_of(n)) is not None] == names[-3:]
        assert ledger.candidate(names[0]).state is State.RECEIVED  # evicted: read from the log
        assert ledger.check(names[0]).state is State.VERIFIED
        assert reader.held == 3 and reader.cached(stream_of(names[1])) is None  # the least recent went
        other.check(names[1])  # moved behind this Ledger's back while evicted
        assert ledger.candidate(names[1]).state is State.VERIFIED
        assert ledger.hand_off(names[1]).state is State.READY
        again = ledger.receive(manifests[names[2]])  # evicted: a repeated receipt is still a no-op
        assert not again.appended and again.candidate.version == 1 and again.state is State.RECEIVED
        assert reader.held == 3
        working = [names[1], names[2], names[0]]  # the three held now
        assert {n for n in names if reader.cached(stream_of(n)) is not None} == set(working)
        queue = ws.root / "queue.jsonl"
        queue.write_text("{}\n")
        with traced(ledger.store) as statements:
            for _ in range(3):
                for name in working:
                    ledger.record_trusted_state(name, "prompt_queue", queue)
        assert _stream_reads(statements) == []
        assert reader.held == 3
    with Ledger.open(ws.db) as fresh:
        for name in names:
            assert fresh.candidate(name) == fold_candidate(fresh.store.read_stream(stream_of(name)))


def test_the_candidate_cache_size_is_checked() -> None:
    from lifecycle_fsm.store import MemoryEventStore

    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(InputError, match="cached_candidates"):
            Ledger(MemoryEventStore(), cached_candidates=bad)  # type: ignore[arg-type]


def test_a_settings_sweep_keeps_the_working_set_held(ws: Workspace) -> None:
    """A settings change reads every candidate to find the decided ones; the ones it only read
    must not push the supervisor's working set out of the cache (the sweep held every stream it
    read: with 1,024 held and 20k candidates, the next commands all re-read their streams). The
    candidates it invalidated are held (the next command on them is likely), the rest untouched;
    with room in the cache, it holds what it read (the next sweep reads only what is new)."""
    names = [f"dpo-{i}" for i in range(6)]
    with ws.ledger(cached_candidates=3) as ledger:
        ledger.activate_baseline(ws.baseline())
        for name in names:
            ledger.receive(ws.dpo(name))
        ledger.check(names[0])  # decided (verified): the sweep invalidates it
        working = [names[0], names[1], names[2]]
        for name in reversed(working):
            ledger.candidate(name)
        reader = ledger._reader
        assert {n for n in names if reader.cached(stream_of(n)) is not None} == set(working)
        result = ledger.activate_evaluation("eval-v2")
        assert result.invalidated == (names[0],)
        assert {n for n in names if reader.cached(stream_of(n)) is not None} == set(working)
        assert reader.cached(stream_of(names[0])) == ledger.candidate(names[0])
        assert ledger.candidate(names[0]).state is State.RECEIVED
    with ws.ledger(cached_candidates=10) as roomy:  # within the bound, a sweep holds what it read
        roomy.activate_evaluation("eval-v3")
        assert {n for n in names if roomy._reader.cached(stream_of(n)) is not None} == set(names)
        with traced(roomy.store) as statements:
            roomy.activate_evaluation("eval-v4")
        assert [s for s in _stream_reads(statements) if "version > 0" in s] == []  # tails only


def test_the_artifact_digests_a_ledger_keeps_stay_bounded_too(ws: Workspace) -> None:
    """The digests `check` and `hand_off` re-use (one per adapter checked, with its per-file listing)
    grew without bound: a supervisor that checked 3,000 candidates held 3,001 of them (~2 KB each for a
    two-file adapter, far more for a folder of hundreds of files), though README "Memory" says a
    long-lived Ledger stays flat. At most twice `cached_candidates` are kept, least recently used
    evicted first; the baseline's, read by every check, is never the one evicted, and a working set
    within the bound is still not read again."""
    names = [f"dpo-{i}" for i in range(12)]
    with ws.ledger(cached_candidates=3) as ledger:
        ledger.activate_baseline(ws.baseline())
        for name in names:
            ledger.receive(ws.dpo(name))
            ledger.check(name)
        digests = ledger._digests._entries
        assert len(digests) == 6  # the last five candidates' adapters and the baseline's
        for name in names[-5:]:  # a working set within the bound: re-used, not read again
            check = ledger.check(name).candidate.last_check
            assert check is not None
            assert check["artifact"]["reused_from"] is not None and check["rollback"]["reused_from"] is not None
        assert len(digests) == 6
        assert ledger.check(names[0]).candidate.last_check["artifact"]["reused_from"] is None  # type: ignore[index]
