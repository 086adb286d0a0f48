"""Tests for the domain events: registry, payload round trips, upcasting, triggers (SPEC §5)."""

from __future__ import annotations

import inspect
from typing import Any

import attrs
import orjson
import pytest

from lifecycle_fsm import candidate_events, events
from lifecycle_fsm.candidate_events import (
    CANDIDATE_EVENTS,
    EVENT_TYPES,
    CandidateEvent,
    CandidateReceived,
    CandidateRegistered,
    ChecksRecorded,
    EvidenceInvalidated,
    HandoffDecided,
    InconclusiveCheckRecorded,
    RecoveryCompleted,
    RecoveryPlanned,
    StageFailed,
    TrustedStateInvalidated,
    TrustedStateRecorded,
)
from lifecycle_fsm.errors import CorruptionError, IntegrityError
from lifecycle_fsm.events import (
    LEDGER_EVENTS,
    LEDGER_STREAM,
    BaselineActivated,
    EvaluationActivated,
    Event,
    HeadSealed,
    LedgerInitialized,
    WindowAdvanced,
    candidate_id_of,
    stream_of,
)
from lifecycle_fsm.upcasting import UPCASTERS, event_from_payload, upcast

SHA = "ab" * 32
CHECKS: dict[str, Any] = {
    "freshness": {"fresh": False, "failed_checks": ["source_policy"]},
    "artifact": {"expected": SHA, "actual": "cd" * 32},
    "rollback": {"expected": SHA, "actual": SHA},
    "settings": {"active_policy_version": SHA, "active_window": 1, "max_window_age": 2},
    "rules": {"version": 1, "digest": "ab" * 32},
}

SAMPLES: list[Event] = [
    LedgerInitialized(max_window_age=2, active_window=1),
    BaselineActivated(
        policy_version=SHA,
        previous_policy_version=None,
        manifest_path="sft/manifest.json",
        manifest_sha256="12" * 32,
        adapter_path="sft/adapter",
        adapter_sha256=SHA,
        adapter_actual_sha256=SHA,
        adapter_error=None,
    ),
    WindowAdvanced(active_window=2, previous_window=1),
    EvaluationActivated(evaluation_version="eval-v2", previous_evaluation_version="eval-v1"),
    CandidateRegistered(candidate_id="dpo-v5", kind="dpo", source_policy_version=SHA, provenance={"git": None}),
    CandidateReceived(
        candidate_id="dpo-v5",
        revision=0,
        manifest_path="dpo/manifest.json",
        manifest_sha256="34" * 32,
        candidate={"candidate_kind": "dpo", "policy_version": "dpo-v5", "evidence_window_index": None},
    ),
    ChecksRecorded(passed=False, reason_codes=["source_policy", "artifact"], **CHECKS),
    InconclusiveCheckRecorded(command="check", inconclusive=["artifact"], **CHECKS),
    TrustedStateRecorded(kind="trajectories", path="run/trajectories.jsonl", sha256=SHA),
    TrustedStateInvalidated(kind="trajectories", reason="rewritten on disk"),
    StageFailed(stage="reward"),
    RecoveryPlanned(
        stage="reward",
        recovery_state="trajectories",
        reused_state=True,
        action="resume_reward_from_saved_trajectories",
        blocking=False,
        trusted_states={"trajectories": {"path": "run/t.jsonl", "expected": SHA, "actual": SHA, "available": True}},
    ),
    RecoveryCompleted(stage="reward", action="resume_reward_from_saved_trajectories"),
    HandoffDecided(
        handoff_status="reject",
        upstream_decision="accept",
        hard_failures=["freshness", "artifact"],
        reason_codes=["source_policy", "artifact"],
        **CHECKS,
    ),
    EvidenceInvalidated(cause="window", previous=1, current=2),
    HeadSealed(ledger_id="ab" * 16, seq=7, hash=SHA, key_id="cd" * 32, signature="c2lnbmF0dXJl"),
]
SAMPLE_IDS = [type(sample).__name__ for sample in SAMPLES]


def _event_classes() -> set[type[Event]]:
    """Every concrete event class defined in the event modules (the bases aside)."""
    bases = {Event, candidate_events.CandidateEvent, events.LedgerEvent}
    modules = (events, candidate_events)
    return {
        obj
        for module in modules
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, Event) and obj not in bases and obj.__module__ == module.__name__
    }


# --- the registry ---------------------------------------------------------------------


def test_registry_holds_every_event_class() -> None:
    """EVENT_TYPES registers every event class in the module, keyed by its TYPE (its class name)."""
    assert set(EVENT_TYPES.values()) == _event_classes()
    for name, cls in EVENT_TYPES.items():
        assert name == cls.TYPE == cls.__name__


def test_samples_cover_every_type() -> None:
    """This module's samples include one instance of each registered type."""
    assert sorted(SAMPLE_IDS) == sorted(EVENT_TYPES)


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_event_names_are_past_tense(name: str) -> None:
    """Events are named in the past tense."""
    assert name.endswith("ed")


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_every_type_has_a_schema_version(name: str) -> None:
    """Every event type declares a positive integer schema version."""
    version = EVENT_TYPES[name].SCHEMA_VERSION
    assert isinstance(version, int) and version >= 1


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_events_are_frozen(sample: Event) -> None:
    """An event cannot be changed once made."""
    field = attrs.fields(type(sample))[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(sample, field, "changed")


# --- payload round trips ----------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_payload_round_trip(sample: Event) -> None:
    """to_payload -> JSON bytes -> event_from_payload gives back an equal event."""
    payload = sample.to_payload()
    stored = orjson.loads(orjson.dumps(payload))
    assert stored == payload
    rebuilt = event_from_payload(sample.TYPE, sample.SCHEMA_VERSION, stored)
    assert rebuilt == sample
    assert type(rebuilt) is type(sample)


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_payload_is_exactly_the_fields(sample: Event) -> None:
    """A payload holds the event's fields and nothing else (no type tag, no version)."""
    assert list(sample.to_payload()) == [f.name for f in attrs.fields(type(sample))]


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_unknown_field_is_corruption(sample: Event) -> None:
    """A stored payload with a field the schema lacks is a CorruptionError carrying the seq."""
    payload = {**sample.to_payload(), "surprise": 1}
    with pytest.raises(CorruptionError, match=sample.TYPE) as info:
        event_from_payload(sample.TYPE, sample.SCHEMA_VERSION, payload, seq=41)
    assert info.value.seq == 41


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_missing_field_is_corruption(sample: Event) -> None:
    """A stored payload missing a field is a CorruptionError carrying the seq."""
    payload = sample.to_payload()
    payload.pop(next(iter(payload)))
    with pytest.raises(CorruptionError, match=sample.TYPE) as info:
        event_from_payload(sample.TYPE, sample.SCHEMA_VERSION, payload, seq=42)
    assert info.value.seq == 42


def test_corruption_is_an_integrity_error() -> None:
    """CorruptionError sits under IntegrityError (the CLI maps both to exit 6)."""
    assert issubclass(CorruptionError, IntegrityError)


# --- upcasting ----------------------------------------------------------------------------


def test_unknown_type_is_corruption() -> None:
    """Upcasting, or rebuilding, a type the code does not know is a CorruptionError naming it."""
    with pytest.raises(CorruptionError, match="CandidateTeleported") as info:
        upcast("CandidateTeleported", 1, {}, seq=7)
    assert info.value.seq == 7
    with pytest.raises(CorruptionError, match="CandidateTeleported"):
        event_from_payload("CandidateTeleported", 1, {})


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_future_schema_version_is_corruption(name: str) -> None:
    """A payload from a newer schema than the code knows is refused, never guessed at."""
    newer = EVENT_TYPES[name].SCHEMA_VERSION + 1
    with pytest.raises(CorruptionError, match="newer"):
        upcast(name, newer, {}, seq=3)


def test_current_version_passes_through_unchanged() -> None:
    """At the current version, upcast returns the payload as it is."""
    payload = {"stage": "update"}
    assert upcast("StageFailed", StageFailed.SCHEMA_VERSION, payload) == payload


def upcast_stagefailed_v1_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """A test upcaster: v1 called the field `failed_stage`."""
    rest = {key: value for key, value in payload.items() if key != "failed_stage"}
    return {**rest, "stage": payload["failed_stage"]}


def test_registered_upcaster_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    """With StageFailed at v2 and a v1->v2 upcaster registered, a v1 payload reads as v2."""
    monkeypatch.setattr(StageFailed, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(UPCASTERS, ("StageFailed", 1), upcast_stagefailed_v1_v2)
    assert upcast("StageFailed", 1, {"failed_stage": "sampling"}) == {"stage": "sampling"}
    assert event_from_payload("StageFailed", 1, {"failed_stage": "sampling"}) == StageFailed(stage="sampling")
    assert event_from_payload("StageFailed", 2, {"stage": "update"}) == StageFailed(stage="update")
    with pytest.raises(CorruptionError, match="newer"):
        upcast("StageFailed", 3, {"stage": "update"})


def test_missing_upcaster_is_corruption(monkeypatch: pytest.MonkeyPatch) -> None:
    """With StageFailed at v2 and no upcaster, a v1 payload is a CorruptionError (seq kept)."""
    monkeypatch.setattr(StageFailed, "SCHEMA_VERSION", 2)
    assert ("StageFailed", 1) not in UPCASTERS
    with pytest.raises(CorruptionError, match="no upcaster") as info:
        upcast("StageFailed", 1, {"failed_stage": "sampling"}, seq=9)
    assert info.value.seq == 9
    with pytest.raises(CorruptionError):
        event_from_payload("StageFailed", 1, {"failed_stage": "sampling"})


def test_upcasters_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Upcasters run one version at a time, in order, up to the current version."""
    monkeypatch.setattr(StageFailed, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(UPCASTERS, ("StageFailed", 1), upcast_stagefailed_v1_v2)
    monkeypatch.setitem(UPCASTERS, ("StageFailed", 2), lambda p: {"stage": p["stage"].lower()})
    assert upcast("StageFailed", 1, {"failed_stage": "REWARD"}) == {"stage": "reward"}


def test_upcasters_registry_is_empty_while_everything_is_v1() -> None:
    """No upcaster is registered for a type still at its first version."""
    assert all(version < EVENT_TYPES[name].SCHEMA_VERSION for name, version in UPCASTERS)


# --- triggers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_name", "payload", "trigger"),
    [
        ("CandidateReceived", {"revision": 0, "registered": False}, "receive"),
        ("CandidateReceived", {"revision": 1, "registered": False}, "revise"),
        ("CandidateReceived", {"revision": 4, "registered": False}, "revise"),
        ("CandidateReceived", {"revision": 0, "registered": True}, "complete_registration"),
        ("CandidateRegistered", {}, "register"),
        ("ChecksRecorded", {"passed": True}, "pass_checks"),
        ("ChecksRecorded", {"passed": False}, "fail_checks"),
        ("TrustedStateRecorded", {}, "record_trusted_state"),
        ("TrustedStateInvalidated", {}, "invalidate_trusted_state"),
        ("StageFailed", {"stage": "update"}, "fail_stage"),
        ("StageFailed", {"stage": "artifact_validation"}, "fail_artifact_validation"),
        ("RecoveryPlanned", {"blocking": False}, "plan_recovery"),
        ("RecoveryPlanned", {"blocking": True}, "block_recovery"),
        ("RecoveryCompleted", {}, "complete_recovery"),
        ("HandoffDecided", {"handoff_status": "ready_for_evaluation"}, "hand_off_ready"),
        ("HandoffDecided", {"handoff_status": "tune"}, "hand_off_tune"),
        ("HandoffDecided", {"handoff_status": "reject"}, "hand_off_reject"),
        ("EvidenceInvalidated", {}, "invalidate_evidence"),
    ],
)
def test_trigger_for(type_name: str, payload: dict[str, Any], trigger: str) -> None:
    """Each candidate event type maps its payload to the machine trigger it stands for."""
    assert CANDIDATE_EVENTS[type_name].trigger_for(payload) == trigger


def test_ledger_events_have_no_trigger() -> None:
    """The ledger's own events change settings, never a candidate's state: they have no trigger."""
    assert set(LEDGER_EVENTS) == {"LedgerInitialized", "BaselineActivated", "WindowAdvanced", "EvaluationActivated"}
    assert not any(hasattr(cls, "trigger_for") for cls in LEDGER_EVENTS.values())
    # The seals stream's HeadSealed is neither: it decides nothing (SPEC §8).
    assert set(EVENT_TYPES) == set(LEDGER_EVENTS) | set(CANDIDATE_EVENTS) | {"HeadSealed"}
    assert not hasattr(EVENT_TYPES["HeadSealed"], "trigger_for")


@pytest.mark.parametrize("sample", [s for s in SAMPLES if isinstance(s, CandidateEvent)], ids=type)
def test_instance_trigger_matches_class(sample: CandidateEvent) -> None:
    """An instance's `trigger` is its class's trigger_for over its own payload."""
    assert sample.trigger == type(sample).trigger_for(sample.to_payload())


# --- streams ----------------------------------------------------------------------------------


def test_streams() -> None:
    """Candidate streams are `candidate:<id>`; the ledger stream belongs to no candidate."""
    assert stream_of("dpo-v5") == "candidate:dpo-v5"
    assert candidate_id_of(stream_of("dpo-v5")) == "dpo-v5"
    assert candidate_id_of(stream_of("a:b")) == "a:b"
    assert candidate_id_of(LEDGER_STREAM) is None
