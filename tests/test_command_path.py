"""The command path under a lost race: another writer acts between a command's fold and its append.

Each test gives one Ledger a real SQLite store whose next write transaction first
lets a second Ledger (its own connection to the same file) run a command. That is
exactly the window the command path guards: it must notice (the versions it read
moved), re-fold and re-decide, and never append a decision made from stale state.
Deleting the ledger-stream version assertion in `command_path.py` fails the
settings tests here; deleting the retry fails all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog
from conftest import Workspace

from lifecycle_fsm import RetryPolicy, SettingsResult
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.errors import ConcurrencyError, ConflictError, IllegalCommandError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.store.base import StoreTransaction
from lifecycle_fsm.store.sqlite import SQLiteEventStore


class Interleaved(SQLiteEventStore):
    """A real SQLite store whose next write transaction first runs `meanwhile` (another writer)."""

    meanwhile: Callable[[], object] | None = None

    def _first_meanwhile(self) -> None:
        if self.meanwhile is not None:
            act, self.meanwhile = self.meanwhile, None
            act()

    def transaction(self) -> AbstractContextManager[StoreTransaction]:  # also a one-append transaction's
        self._first_meanwhile()
        return super().transaction()


@pytest.fixture
def pair(ws: Workspace) -> Iterator[tuple[Ledger, Ledger]]:
    """Two writers on one file: `racer` (interleavable) and `other`."""
    with Ledger.open(ws.db, synchronous="NORMAL", actor="other") as other:
        other.init()
        other.activate_baseline(ws.baseline())
        racer = Ledger(Interleaved(ws.db, synchronous="NORMAL"), actor="racer")
        with racer:
            yield racer, other


def meanwhile(ledger: Ledger, act: Callable[[], object]) -> None:
    store = ledger.store
    assert isinstance(store, Interleaved)
    store.meanwhile = act


def payloads(ledger: Ledger, cid: str, type_name: str) -> list[dict[str, Any]]:
    return [orjson.loads(e.payload) for e, _ in ledger.history(cid) if e.type == type_name]


def retried(logs: list[dict[str, Any]]) -> int:
    return sum(1 for entry in logs if entry["event"] == "command_retried")


def second_baseline(ws: Workspace) -> tuple[Path, str]:
    path = ws.baseline("sft-v2")
    return path, hash_directory(ws.root / "sft-v2" / "adapter")


def test_check_is_redecided_against_a_baseline_activated_meanwhile(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """A check folded under baseline 1 but appended after baseline 2 is re-run against baseline 2."""
    racer, other = pair
    racer.receive(ws.dpo())  # its source policy is baseline 1
    path, new_policy = second_baseline(ws)
    meanwhile(racer, lambda: other.activate_baseline(path))
    with structlog.testing.capture_logs() as logs:
        result = racer.check("dpo-v5")
    assert retried(logs) == 1
    (recorded,) = payloads(racer, "dpo-v5", "ChecksRecorded")
    assert recorded["settings"]["active_policy_version"] == new_policy
    assert recorded["settings"]["ledger_version"] == racer.settings().version
    assert result.state == "reject" and "source_policy" in recorded["reason_codes"]


def test_handoff_is_redecided_against_a_window_advanced_meanwhile(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """A DPO hand-off is not invalidated by a window change, but its evidence must name the new window."""
    racer, other = pair
    racer.receive(ws.dpo())
    assert racer.check("dpo-v5").state == "verified"
    meanwhile(racer, lambda: other.advance_window(5))
    with structlog.testing.capture_logs() as logs:
        result = racer.hand_off("dpo-v5")
    assert retried(logs) == 1
    assert result.state == "ready"
    (decided,) = payloads(racer, "dpo-v5", "HandoffDecided")
    assert decided["settings"]["active_window"] == 5
    assert decided["settings"]["ledger_version"] == racer.settings().version


def test_recovery_plan_is_redecided_against_a_baseline_activated_meanwhile(
    ws: Workspace, pair: tuple[Ledger, Ledger]
) -> None:
    """A plan is decided on the settings as they are when it is appended: the candidate's own baseline,
    now no longer the active one, and it says so."""
    racer, other = pair
    racer.receive(ws.dpo())
    path, new_policy = second_baseline(ws)
    meanwhile(racer, lambda: other.activate_baseline(path))
    with structlog.testing.capture_logs() as logs:
        racer.fail_stage("dpo-v5", "artifact_validation")
    assert retried(logs) == 1
    (plan,) = payloads(racer, "dpo-v5", "RecoveryPlanned")
    baseline = plan["trusted_states"]["verified_baseline"]
    assert baseline["expected"] == ws.sft_sha != new_policy
    assert new_policy in baseline["note"] and "no longer the active one" in baseline["note"]
    assert plan["action"] == "rollback_to_verified_baseline"


def test_handoff_refused_once_a_baseline_change_invalidated_the_candidate(
    ws: Workspace, pair: tuple[Ledger, Ledger]
) -> None:
    """The other writer invalidated the verified candidate: the re-decided hand-off is refused, nothing appended."""
    racer, other = pair
    racer.receive(ws.dpo())
    racer.check("dpo-v5")
    path, _ = second_baseline(ws)
    meanwhile(racer, lambda: other.activate_baseline(path))
    head = racer.store.head().seq
    with pytest.raises(IllegalCommandError, match="received"):
        racer.hand_off("dpo-v5")
    assert racer.store.head().seq == head + 2  # the baseline and its invalidation, nothing of ours
    assert racer.candidate("dpo-v5").state == "received"


def test_receive_of_the_same_manifest_meanwhile_is_a_noop(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """Two writers receive one manifest at once: one CandidateReceived, the loser re-decides to a no-op."""
    racer, other = pair
    manifest = ws.dpo()
    meanwhile(racer, lambda: other.receive(manifest))
    result = racer.receive(manifest)
    assert result.events == ()
    assert len(payloads(racer, "dpo-v5", "CandidateReceived")) == 1


def test_receive_of_another_manifest_meanwhile_is_refused(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """The id was taken by a different manifest meanwhile: the loser's receive is refused."""
    racer, other = pair
    mine, theirs = ws.dpo(), ws.dpo("other-dpo", policy_version="dpo-v5")
    meanwhile(racer, lambda: other.receive(theirs))
    with pytest.raises(IllegalCommandError, match="different manifest"):
        racer.receive(mine)
    assert len(payloads(racer, "dpo-v5", "CandidateReceived")) == 1


def test_trusted_state_recorded_meanwhile_is_kept_beside_ours(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """Two trusted states recorded at once on one candidate: both land, at consecutive versions."""
    racer, other = pair
    racer.receive(ws.grpo())
    queue, trajectories = ws.root / "queue.jsonl", ws.root / "trajectories.jsonl"
    queue.write_text("q\n")
    trajectories.write_text("t\n")
    meanwhile(racer, lambda: other.record_trusted_state("grpo-v7", "prompt_queue", queue))
    with structlog.testing.capture_logs() as logs:
        result = racer.record_trusted_state("grpo-v7", "trajectories", trajectories)
    assert retried(logs) == 1
    assert result.candidate is not None
    assert sorted(result.candidate.trusted_states) == ["prompt_queue", "trajectories"]
    assert [e.version for e, _ in racer.history("grpo-v7")] == [1, 2, 3]


def test_untrust_after_the_same_untrust_meanwhile_conflicts(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    racer, other = pair
    racer.receive(ws.grpo())
    queue = ws.root / "queue.jsonl"
    queue.write_text("q\n")
    racer.record_trusted_state("grpo-v7", "prompt_queue", queue)
    meanwhile(racer, lambda: other.invalidate_trusted_state("grpo-v7", "prompt_queue"))
    with pytest.raises(ConflictError, match="no trusted prompt_queue"):
        racer.invalidate_trusted_state("grpo-v7", "prompt_queue")
    assert len(payloads(racer, "grpo-v7", "TrustedStateInvalidated")) == 1


def test_recovered_after_the_same_recovered_meanwhile_is_refused(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    racer, other = pair
    racer.receive(ws.grpo())
    racer.fail_stage("grpo-v7", "sampling")
    meanwhile(racer, lambda: other.complete_recovery("grpo-v7"))
    with pytest.raises(IllegalCommandError, match=r"`recovered \(complete_recovery\)` is not allowed"):
        racer.complete_recovery("grpo-v7")
    assert len(payloads(racer, "grpo-v7", "RecoveryCompleted")) == 1


def test_settings_change_meanwhile_is_folded_before_ours(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """A baseline activation that lost to an evaluation change re-decides and keeps both."""
    racer, other = pair
    path, new_policy = second_baseline(ws)
    meanwhile(racer, lambda: other.activate_evaluation("eval-v2"))
    with structlog.testing.capture_logs() as logs:
        result = racer.activate_baseline(path)
    assert retried(logs) == 1
    assert result.settings is not None
    assert (result.settings.active_policy_version, result.settings.evaluation_version) == (new_policy, "eval-v2")
    assert [e.version for e in racer.store.read_stream("ledger")] == [1, 2, 3, 4]


def test_window_fan_out_reaches_a_candidate_decided_meanwhile(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """A GRPO candidate handed off while a window change was being decided is still invalidated."""
    racer, other = pair
    other.receive(ws.grpo())
    other.check("grpo-v7")
    meanwhile(racer, lambda: other.hand_off("grpo-v7"))
    result = racer.advance_window(2)
    assert result.invalidated == ("grpo-v7",)
    assert racer.candidate("grpo-v7").state == "received"
    assert racer.candidate("grpo-v7").reason_codes == ("window_changed",)


def test_a_race_lost_past_the_deadline_surfaces(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """With no time left to re-decide, the lost race reaches the caller as ConcurrencyError.

    The first attempt decides from the racer's cache; its refusal is re-read at once,
    deadline or not (a stale cache is no lost race). The race lost after that re-read
    is the one that surfaces."""
    racer, other = pair
    racer.receive(ws.dpo())
    racer.settings()
    racer._path.retry = RetryPolicy(deadline=0.0)
    path, _ = second_baseline(ws)

    def baseline_then_window() -> None:
        other.activate_baseline(path)
        meanwhile(racer, lambda: other.advance_window(2))  # between the re-read and its append

    meanwhile(racer, baseline_then_window)
    head = racer.store.head().seq
    with structlog.testing.capture_logs() as logs, pytest.raises(ConcurrencyError) as info:
        racer.check("dpo-v5")
    assert info.value.stream_id == "ledger"
    assert [entry["cached"] for entry in logs if entry["event"] == "command_retried"] == [True]
    assert racer.store.head().seq == head + 2  # only the other writer's baseline and window


# --- retries with an idempotency key, and the path's own refusals ------------------------------


def test_same_event_id_appended_meanwhile_makes_ours_the_duplicate(ws: Workspace, pair: tuple[Ledger, Ledger]) -> None:
    """Two supervisors send one command with one key at once: one append, the loser gets the winner's events."""
    racer, other = pair
    racer.receive(ws.dpo())
    meanwhile(racer, lambda: other.check("dpo-v5", event_id="run-1/check"))
    result = racer.check("dpo-v5", event_id="run-1/check")
    assert result.duplicate and result.candidate is not None and result.candidate.state == "verified"
    assert len(payloads(racer, "dpo-v5", "ChecksRecorded")) == 1
    path, _ = second_baseline(ws)
    meanwhile(racer, lambda: other.activate_baseline(path, event_id="run-1/baseline"))
    again = racer.activate_baseline(path, event_id="run-1/baseline")
    assert again.duplicate and again.settings is not None
    assert [e.type for e in racer.store.read_stream("ledger")].count("BaselineActivated") == 2


def test_retried_keys_return_every_event_of_the_first_run(ws: Workspace, active_pair: Ledger) -> None:
    """A retried multi-event command returns all its events; a retried settings command its settings."""
    ledger = active_pair
    ledger.receive(ws.grpo())
    first = ledger.fail_stage("grpo-v7", "sampling", event_id="k/fail")
    again = ledger.fail_stage("grpo-v7", "sampling", event_id="k/fail")
    assert again.duplicate and [e.type for e in again.events] == ["StageFailed", "RecoveryPlanned"]
    assert [e.seq for e in again.events] == [e.seq for e in first.events]
    ledger.complete_recovery("grpo-v7", event_id="k/recovered")
    retried_recovery = ledger.complete_recovery("grpo-v7", event_id="k/recovered")  # now received: no re-decide
    assert retried_recovery.duplicate and retried_recovery.candidate is not None
    assert retried_recovery.candidate.state == "received"
    ledger.advance_window(3, event_id="k/window")
    retried_window = ledger.advance_window(3, event_id="k/window")
    assert retried_window.duplicate and isinstance(retried_window, SettingsResult)
    assert retried_window.settings is not None and retried_window.settings.active_window == 3


def test_a_noop_settings_command_still_reports_the_settings(ws: Workspace, active_pair: Ledger) -> None:
    result = active_pair.init()
    assert result.events == () and result.settings is not None and result.settings.max_window_age == 2


def test_a_decision_the_table_forbids_is_refused_as_internal(ws: Workspace, active_pair: Ledger) -> None:
    """A (buggy) decision that makes an illegal move is refused before anything is written."""
    from lifecycle_fsm.candidate_events import RecoveryCompleted
    from lifecycle_fsm.command_path import Command
    from lifecycle_fsm.decisions import Decision
    from lifecycle_fsm.events import stream_of

    ledger = active_pair
    ledger.receive(ws.dpo())
    head = ledger.store.head().seq

    def decide(current: object, settings: object) -> Decision:
        return Decision((RecoveryCompleted("x", "y"),))

    with pytest.raises(IllegalCommandError, match="internal: complete_recovery is not allowed from state received"):
        ledger._path.run(Command(stream_of("dpo-v5"), decide, "check", None, "RecoveryCompleted"))
    assert ledger.store.head().seq == head


def test_refusal_on_reject_says_it_is_terminal(ws: Workspace, active_pair: Ledger) -> None:
    ledger = active_pair
    ledger.receive(ws.dpo(source_policy_version="an-old-baseline"))
    assert ledger.check("dpo-v5").state == "reject"
    with pytest.raises(IllegalCommandError, match=r"\(allowed: nothing, reject is terminal\)"):
        ledger.hand_off("dpo-v5")


def test_a_refusal_names_each_command_as_the_cli_and_the_ledger_call_it(ws: Workspace, active_pair: Ledger) -> None:
    """A supervisor calling `hand_off` reads its own method's name beside the command line's."""
    from lifecycle_fsm.machine import METHOD_BY_COMMAND

    assert all(callable(getattr(Ledger, method, None)) for method in METHOD_BY_COMMAND.values())
    active_pair.receive(ws.dpo())
    with pytest.raises(IllegalCommandError) as refused:
        active_pair.hand_off("dpo-v5")
    message = str(refused.value)
    assert "`handoff (hand_off)` is not allowed there" in message
    assert "(allowed: check, fail (fail_stage), receive, trusted (record_trusted_state), untrust" in message


@pytest.fixture
def active_pair(pair: tuple[Ledger, Ledger]) -> Ledger:
    """The interleavable ledger of `pair`, initialised with an active baseline."""
    return pair[0]
