"""Tests for the pure fold: state is a function of the event payloads (SPEC §4, §5)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import orjson
import pytest

from lifecycle_fsm.candidate_events import CandidateReceived, StageFailed
from lifecycle_fsm.errors import CorruptionError, InputError
from lifecycle_fsm.events import (
    LEDGER_STREAM,
    SEALS_STREAM,
    BaselineActivated,
    EvaluationActivated,
    LedgerInitialized,
    WindowAdvanced,
    stream_of,
)
from lifecycle_fsm.state import (
    CandidateState,
    IllegalTransition,
    LedgerSettings,
    LedgerState,
    apply,
    stream_start,
)
from lifecycle_fsm.state import fold as fold_rows
from lifecycle_fsm.upcasting import CURRENT_VERSIONS

STREAM = stream_of("grpo-v7")


def _row(type_name: str, payload: dict[str, Any], seq: int, stream_id: str, version: int) -> Any:
    return (seq, stream_id, version, type_name, CURRENT_VERSIONS.get(type_name, 1), orjson.dumps(payload).decode())


def apply_candidate(
    current: CandidateState | None,
    type_name: str,
    payload: dict[str, Any],
    *,
    seq: int,
    stream_id: str,
    version: int | None = None,
) -> CandidateState:
    """One candidate event folded through the one fold."""
    version = version if version is not None else 1 if current is None else current.version + 1
    folded = fold_rows([_row(type_name, payload, seq, stream_id, version)], stream_start(current))
    return folded.candidates[stream_id.removeprefix("candidate:")]


def apply_settings(settings: LedgerSettings, type_name: str, payload: dict[str, Any], seq: int) -> LedgerSettings:
    """One ledger event folded through the one fold."""
    row = _row(type_name, payload, seq, LEDGER_STREAM, settings.version + 1)
    return fold_rows([row], LedgerState(settings, {}, settings.last_seq)).settings


candidate_from_dict = CandidateState.from_dict


def settings_from_dict(data: dict[str, Any]) -> LedgerSettings:
    return LedgerSettings(**data)


SHA = "ab" * 32
FIELDS = {"candidate_kind": "grpo", "policy_version": "grpo-v7", "evidence_window_index": 1, "decision": "accept"}
Step = tuple[str, dict[str, Any]]


def received(revision: int = 0, **fields: Any) -> Step:
    return "CandidateReceived", {
        "candidate_id": "grpo-v7",
        "revision": revision,
        "manifest_path": f"grpo/manifest-r{revision}.json",
        "manifest_sha256": SHA,
        "candidate": {**FIELDS, **fields},
        "artifact_at_receipt": None,
        "registered": False,
    }


def checks(*reasons: str) -> Step:
    return "ChecksRecorded", {
        "passed": not reasons,
        "reason_codes": list(reasons),
        "freshness": {"fresh": "source_policy" not in reasons, "failed_checks": []},
        "artifact": {"expected": SHA, "actual": SHA},
        "rollback": {"expected": SHA, "actual": SHA},
        "settings": {"active_window": 1},
        "rules": {"version": 1, "digest": "x"},
    }


def trusted(kind: str) -> Step:
    return "TrustedStateRecorded", {"kind": kind, "path": f"run/{kind}", "sha256": SHA}


def untrusted(kind: str) -> Step:
    return "TrustedStateInvalidated", {"kind": kind, "reason": "gone"}


def stage_failed(stage: str) -> Step:
    return "StageFailed", {"stage": stage}


def planned(action: str, *, blocking: bool = False, state: str | None = None) -> Step:
    return "RecoveryPlanned", {
        "stage": "update",
        "recovery_state": state,
        "reused_state": state is not None,
        "action": action,
        "blocking": blocking,
        "trusted_states": {},
        "checkpoint": None,
    }


def recovered() -> Step:
    return "RecoveryCompleted", {"stage": "update", "action": "restore_pre_update_checkpoint", "resumed_from": None}


def handoff(status: str, *reasons: str) -> Step:
    return "HandoffDecided", {
        "handoff_status": status,
        "upstream_decision": "tune" if status == "tune" else "accept",
        "hard_failures": [],
        "reason_codes": list(reasons),
        "freshness": {"fresh": True, "failed_checks": []},
        "artifact": {},
        "rollback": {},
        "settings": {},
        "rules": {"version": 1, "digest": "x"},
    }


def invalidated(cause: str) -> Step:
    return "EvidenceInvalidated", {"cause": cause, "previous": 1, "current": 2}


def fold(steps: Iterable[Step], *, first_seq: int = 1) -> list[CandidateState]:
    """Fold steps at consecutive seqs and versions; return the state after each."""
    states: list[CandidateState] = []
    current: CandidateState | None = None
    for i, (type_name, payload) in enumerate(steps):
        current = apply_candidate(current, type_name, payload, seq=first_seq + i, stream_id=STREAM, version=i + 1)
        states.append(current)
    return states


LIFE = [
    received(),  # 1 received
    trusted("pre_update_checkpoint"),  # 2
    checks(),  # 3 verified
    stage_failed("update"),  # 4 verified
    planned("restore_pre_update_checkpoint", state="pre_update_checkpoint"),  # 5 recovering
    recovered(),  # 6 received
    checks(),  # 7 verified
    handoff("tune"),  # 8 tune
    received(revision=1, decision="accept"),  # 9 received
    untrusted("pre_update_checkpoint"),  # 10 received
    checks(),  # 11 verified
    handoff("ready_for_evaluation"),  # 12 ready
    checks(),  # 13 ready (a passing re-check)
    invalidated("baseline"),  # 14 received
    checks("source_policy", "artifact"),  # 15 reject
]


def test_a_whole_life_folds_to_the_expected_states() -> None:
    """State, version and decisive event after each step of a hand-built life."""
    states = fold(LIFE, first_seq=101)
    assert [s.state for s in states] == [
        "received",
        "received",
        "verified",
        "verified",
        "recovering",
        "received",
        "verified",
        "tune",
        "received",
        "received",
        "verified",
        "ready",
        "ready",
        "received",
        "reject",
    ]
    assert [s.version for s in states] == list(range(1, 16))
    assert [s.last_seq for s in states] == list(range(101, 116))
    decisive = [101, 101, 103, 103, 105, 106, 107, 108, 109, 109, 111, 112, 112, 114, 115]
    assert [s.decisive_seq for s in states] == decisive
    final = states[-1]
    assert final.decisive_type == "ChecksRecorded"
    assert final.reason_codes == ("source_policy", "artifact")
    assert final.kind == "grpo"
    assert final.candidate_id == "grpo-v7"


def test_trusted_states_are_recorded_then_invalidated() -> None:
    """A recorded trusted state carries its path, sha256 and seq; invalidation removes it; a revision keeps it."""
    states = fold(LIFE)
    assert states[0].trusted_states == {}
    recorded = {"pre_update_checkpoint": {"path": "run/pre_update_checkpoint", "sha256": SHA, "seq": 2}}
    assert states[1].trusted_states == recorded
    assert states[8].trusted_states == recorded  # survives the revision
    assert states[9].trusted_states == {}


def test_invalidating_an_unrecorded_state_changes_nothing_else() -> None:
    """Invalidating a kind never recorded leaves the trusted states as they were."""
    states = fold([received(), trusted("prompt_queue"), untrusted("trajectories")])
    assert list(states[-1].trusted_states) == ["prompt_queue"]
    assert states[-1].state == "received"


def test_last_check_recovery_and_handoff_are_kept_with_their_seq() -> None:
    """The latest check, recovery plan and hand-off are kept as their payload plus seq."""
    states = fold(LIFE)
    assert states[2].last_check == {**checks()[1], "seq": 3}
    plan = planned("restore_pre_update_checkpoint", state="pre_update_checkpoint")[1]
    assert states[4].last_recovery == {**plan, "seq": 5}
    assert states[7].last_handoff == {**handoff("tune")[1], "seq": 8}
    assert states[6].last_recovery == states[4].last_recovery  # later events keep it
    assert states[12].last_check is not None and states[12].last_check["seq"] == 13
    assert states[-1].last_check == {**checks("source_policy", "artifact")[1], "seq": 15}


def test_a_revision_starts_a_fresh_record() -> None:
    """A revised manifest replaces the candidate fields and revision, and clears the old decision."""
    states = fold(LIFE)
    revised = states[8]
    assert revised.revision == 1
    assert revised.manifest_path == "grpo/manifest-r1.json"
    assert revised.candidate["decision"] == "accept"
    assert revised.last_handoff is None and revised.last_check is None
    assert revised.reason_codes == ()


def test_reason_codes_follow_the_decisive_event() -> None:
    """Reasons come from the event that moved the candidate (checks, hand-off, blocking plan, invalidation)."""
    blocked = fold([received(), planned("block_update", blocking=True)])[-1]
    assert (blocked.state, blocked.reason_codes) == ("reject", ("block_update",))
    rejected = fold([received(), checks(), handoff("reject", "upstream_reject")])[-1]
    assert (rejected.state, rejected.reason_codes, rejected.decisive_seq) == ("reject", ("upstream_reject",), 3)
    window = fold([received(), checks(), invalidated("window")])[-1]
    assert (window.state, window.reason_codes) == ("received", ("window_changed",))
    recovering = fold([received(), stage_failed("update"), planned("restore_pre_update_checkpoint")])[-1]
    assert (recovering.state, recovering.reason_codes) == ("recovering", ())


# --- illegal sequences ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "state", "trigger"),
    [
        ([checks()], None, "pass_checks"),
        ([trusted("prompt_queue")], None, "record_trusted_state"),
        ([received(revision=1)], None, "revise"),
        ([received(), handoff("ready_for_evaluation")], "received", "hand_off_ready"),
        ([received(), received()], "received", "receive"),
        ([received(), recovered()], "received", "complete_recovery"),
        ([received(), checks("artifact"), handoff("ready_for_evaluation")], "reject", "hand_off_ready"),
        ([received(), checks("artifact"), checks()], "reject", "pass_checks"),
        ([received(), checks("artifact"), trusted("prompt_queue")], "reject", "record_trusted_state"),
        ([received(), checks("artifact"), received(revision=1)], "reject", "revise"),
        ([received(), checks(), handoff("tune"), handoff("tune")], "tune", "hand_off_tune"),
        ([received(), planned("rebuild_prompt_queue"), checks()], "recovering", "pass_checks"),
    ],
)
def test_illegal_sequence_is_reported_structurally(steps: list[Step], state: str | None, trigger: str) -> None:
    """An illegal move raises IllegalTransition naming the seq, the state, the trigger and what was allowed."""
    *prefix, last = steps
    current = fold(prefix, first_seq=10)[-1] if prefix else None
    bad_seq = 10 + len(prefix)
    with pytest.raises(IllegalTransition) as info:
        apply_candidate(current, last[0], last[1], seq=bad_seq, stream_id=STREAM, version=len(prefix) + 1)
    err = info.value
    assert isinstance(err, CorruptionError)
    assert (err.seq, err.state, err.trigger) == (bad_seq, state, trigger)
    assert err.details["stream_id"] == STREAM
    assert f"seq {bad_seq}" in str(err)
    expected_allowed = {None: ["receive", "register"], "reject": []}.get(state)
    if expected_allowed is not None:
        assert err.allowed == expected_allowed
    assert trigger not in err.allowed


def test_illegal_move_from_received_lists_allowed_triggers() -> None:
    """From `received`, a hand-off is refused and the error lists the table's triggers from there."""
    current = fold([received()])[-1]
    with pytest.raises(IllegalTransition) as info:
        apply_candidate(current, *handoff("ready_for_evaluation"), seq=2, stream_id=STREAM)
    assert info.value.allowed == [
        "block_recovery",
        "check_inconclusive",
        "complete_registration",
        "fail_artifact_validation",
        "fail_checks",
        "fail_stage",
        "invalidate_trusted_state",
        "pass_checks",
        "plan_recovery",
        "record_trusted_state",
    ]


@pytest.mark.parametrize("version", [3, 1, 0])
def test_version_gap_is_corruption(version: int) -> None:
    """A stream whose next version is not current+1 is a CorruptionError (not an illegal move)."""
    current = fold([received()])[-1]
    with pytest.raises(CorruptionError, match="version") as info:
        apply_candidate(current, *checks(), seq=2, stream_id=STREAM, version=version)
    assert not isinstance(info.value, IllegalTransition)
    assert info.value.seq == 2


def test_first_event_must_be_version_one() -> None:
    """A stream that starts at version 2 is corrupt."""
    with pytest.raises(CorruptionError, match="version"):
        apply_candidate(None, *received(), seq=1, stream_id=STREAM, version=2)


@pytest.mark.parametrize("type_name", ["LedgerInitialized", "BaselineActivated", "WindowAdvanced", "NoSuchEvent"])
def test_non_candidate_event_on_candidate_stream_is_corruption(type_name: str) -> None:
    """Ledger-setting events and unknown types have no place on a candidate stream."""
    current = fold([received()])[-1]
    with pytest.raises(CorruptionError, match=type_name):
        apply_candidate(current, type_name, {}, seq=2, stream_id=STREAM)


# --- the ledger's own stream ----------------------------------------------------------------

BASELINE = {
    "policy_version": SHA,
    "previous_policy_version": None,
    "manifest_path": "sft/manifest.json",
    "manifest_sha256": SHA,
    "adapter_path": "sft/adapter",
    "adapter_sha256": SHA,
    "adapter_actual_sha256": SHA,
    "adapter_error": None,
    "adapter_tree": None,
}


def test_apply_settings_folds_the_four_ledger_events() -> None:
    """Initialised, baseline, window and evaluation events set what every check reads."""
    s = LedgerSettings()
    assert (s.initialized, s.active_policy_version, s.version) == (False, None, 0)
    s = apply_settings(s, "LedgerInitialized", {"max_window_age": 2, "active_window": 1, "ledger_id": None}, 1)
    assert (s.initialized, s.max_window_age, s.active_window, s.version, s.last_seq) == (True, 2, 1, 1, 1)
    s = apply_settings(s, "BaselineActivated", BASELINE, 5)
    assert s.baseline == BASELINE and s.active_policy_version == SHA
    assert (s.version, s.last_seq) == (2, 5)
    s = apply_settings(s, "WindowAdvanced", {"active_window": 3, "previous_window": 1}, 9)
    assert (s.active_window, s.max_window_age, s.version, s.last_seq) == (3, 2, 3, 9)
    s = apply_settings(
        s, "EvaluationActivated", {"evaluation_version": "eval-v2", "previous_evaluation_version": None}, 12
    )
    assert (s.evaluation_version, s.version, s.last_seq) == ("eval-v2", 4, 12)
    assert s.active_policy_version == SHA  # untouched by later settings


@pytest.mark.parametrize("type_name", ["CandidateReceived", "ChecksRecorded", "HandoffDecided", "NoSuchEvent"])
def test_candidate_event_on_ledger_stream_is_corruption(type_name: str) -> None:
    """A candidate event (or an unknown type) on the ledger stream is a CorruptionError with its seq."""
    with pytest.raises(CorruptionError, match=type_name) as info:
        apply_settings(LedgerSettings(), type_name, {}, 4)
    assert info.value.seq == 4


def test_typed_apply_dispatches_on_stream() -> None:
    """apply() folds ledger events into settings and candidate events into a candidate."""
    settings = apply(None, LedgerInitialized(max_window_age=2, active_window=1), seq=1, stream_id=LEDGER_STREAM)
    assert isinstance(settings, LedgerSettings) and settings.active_window == 1
    settings = apply(settings, BaselineActivated(**BASELINE), seq=2, stream_id=LEDGER_STREAM)
    settings = apply(settings, WindowAdvanced(active_window=2, previous_window=1), seq=3, stream_id=LEDGER_STREAM)
    evaluation = EvaluationActivated(evaluation_version="e2", previous_evaluation_version=None)
    settings = apply(settings, evaluation, seq=4, stream_id=LEDGER_STREAM)
    assert isinstance(settings, LedgerSettings) and settings.version == 4
    name, payload = received()
    candidate = apply(None, CandidateReceived(**payload), seq=5, stream_id=STREAM)
    candidate = apply(candidate, StageFailed(stage="reward"), seq=6, stream_id=STREAM)
    assert isinstance(candidate, CandidateState)
    assert candidate == fold([(name, payload), stage_failed("reward")], first_seq=5)[-1]
    # The SPEC's two-argument form: the stream and the next seq from the state and the event.
    assert apply(None, CandidateReceived(**payload)) == fold([(name, payload)], first_seq=1)[-1]
    assert apply(candidate, StageFailed(stage="reward")) == apply(
        candidate, StageFailed(stage="reward"), seq=7, stream_id=STREAM
    )
    assert apply(settings, WindowAdvanced(active_window=3, previous_window=2)) == apply(
        settings, WindowAdvanced(active_window=3, previous_window=2), seq=5, stream_id=LEDGER_STREAM
    )
    with pytest.raises(InputError, match="names no candidate"):
        apply(None, StageFailed(stage="reward"))
    with pytest.raises(InputError, match="does not fold onto a CandidateState"):
        apply(candidate, WindowAdvanced(active_window=3, previous_window=2))  # was fresh default settings
    with pytest.raises(InputError, match="does not fold onto a LedgerSettings"):
        apply(settings, CandidateReceived(**payload))
    for elsewhere in ("elsewhere", SEALS_STREAM):  # a seal is folded only as a row of the whole log
        with pytest.raises(CorruptionError, match="unknown stream"):
            apply(None, StageFailed(stage="reward"), seq=7, stream_id=elsewhere)


def test_a_row_not_after_the_last_one_folded_is_refused() -> None:
    """Folding on from a position, a row at that very position (or before it) is a row folded twice:
    refused even where no stream version would notice (the ledger's own events)."""
    settings = apply_settings(
        LedgerSettings(), "LedgerInitialized", {"max_window_age": 2, "active_window": 1, "ledger_id": None}, 7
    )
    again = _row("WindowAdvanced", {"active_window": 2, "previous_window": 1}, 7, LEDGER_STREAM, 2)
    for seq in (7, 6):
        with pytest.raises(CorruptionError, match=f"seq {seq} is not after seq 7"):
            fold_rows([(seq, *again[1:])], LedgerState(settings, {}, 7))


def test_a_seal_is_read_by_the_fold_though_it_decides_nothing() -> None:
    """A seal's payload that is not JSON is corruption at its seq, as any other event's."""
    seal = (1, SEALS_STREAM, 1, "HeadSealed", CURRENT_VERSIONS["HeadSealed"], '{"seq": 1')
    with pytest.raises(CorruptionError, match="seq 1: HeadSealed payload is not JSON"):
        fold_rows([seal])


# --- serialisation and determinism ------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 1, 4, 7, 12, 14])
def test_candidate_dict_round_trip(index: int) -> None:
    """to_dict survives JSON and candidate_from_dict rebuilds an equal state."""
    state = fold(LIFE)[index]
    data = orjson.loads(orjson.dumps(state.to_dict()))
    assert data == state.to_dict()
    assert candidate_from_dict(data) == state


def test_candidate_from_dict_is_strict() -> None:
    """An unknown field in a stored candidate is refused, not ignored."""
    data = fold(LIFE)[-1].to_dict() | {"surprise": 1}
    with pytest.raises(KeyError, match="surprise"):
        candidate_from_dict(data)


def test_settings_dict_round_trip() -> None:
    """Settings survive attrs.asdict -> JSON -> settings_from_dict."""
    s = apply_settings(
        LedgerSettings(), "LedgerInitialized", {"max_window_age": 2, "active_window": 1, "ledger_id": None}, 1
    )
    s = apply_settings(s, "BaselineActivated", BASELINE, 2)
    assert settings_from_dict(orjson.loads(orjson.dumps(attrs.asdict(s)))) == s


def test_fold_is_deterministic() -> None:
    """Folding the same payloads twice gives equal states (and equal serialisations)."""
    first, second = fold(LIFE), fold(LIFE)
    assert first == second
    assert [orjson.dumps(s.to_dict()) for s in first] == [orjson.dumps(s.to_dict()) for s in second]


def test_fold_does_not_mutate_its_input() -> None:
    """The fold never changes the payloads it reads or the state it starts from."""
    steps = [received(), trusted("prompt_queue"), checks()]
    snapshot = orjson.dumps(steps)
    states = fold(steps)
    assert orjson.dumps(steps) == snapshot
    assert states[0].trusted_states == {} and states[0].state == "received"
