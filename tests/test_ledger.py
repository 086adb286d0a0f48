"""The Ledger API on real files: commands in, events out, decisions with their evidence."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
import structlog
from conftest import DROP, Workspace, cli, count_events

from lifecycle_fsm import RecoveryAction, State
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.errors import (
    ArtifactError,
    ConflictError,
    DuplicateEventError,
    IllegalCommandError,
    InputError,
    NotFoundError,
)
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import verify
from lifecycle_fsm.replay.drills.workspace import candidate_manifest

HEX64 = re.compile(r"[0-9a-f]{64}")


def flip_byte(path: Path, offset: int = 100) -> None:
    """Change one byte of a file in place (a silent corruption)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def weights(ws: Workspace, name: str) -> Path:
    """The weights file of the adapter `ws` wrote for `name`."""
    return ws.root / name / "adapter" / "adapter_model.safetensors"


def saved_state(ws: Workspace, kind: str) -> Path:
    """A real folder a training stage saved, for `record_trusted_state`."""
    folder = ws.root / "states" / kind
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.bin").write_bytes(f"{kind} payload".encode() * 100)
    return folder


def types(ledger: Ledger, cid: str) -> list[str]:
    """The event types of one candidate's stream, oldest first."""
    return [stored.type for stored, _ in ledger.history(cid)]


@pytest.fixture
def active(ws: Workspace, ledger: Ledger) -> Ledger:
    """A ledger initialized with the seed defaults and an active SFT baseline."""
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    return ledger


def to_ready(ledger: Ledger, manifest: Path) -> str:
    """Receive, check and hand off a candidate; return its id."""
    cid = ledger.receive(manifest).candidate.candidate_id  # type: ignore[union-attr]
    assert ledger.check(cid).state == "verified"
    ledger.hand_off(cid)
    return cid


def test_happy_path_dpo_and_grpo_reach_ready(ws: Workspace, active: Ledger) -> None:
    """A fresh DPO and GRPO candidate go received -> verified -> ready with empty reason codes."""
    for manifest, kind in ((ws.dpo(), "dpo"), (ws.grpo(), "grpo")):
        received = active.receive(manifest)
        assert (received.state, received.candidate.kind) == ("received", kind)  # type: ignore[union-attr]
        cid = received.candidate.candidate_id  # type: ignore[union-attr]
        checked = active.check(cid)
        assert checked.state == "verified" and checked.candidate.reason_codes == ()  # type: ignore[union-attr]
        assert active.hand_off(cid).state == "ready"
        assert types(active, cid) == ["CandidateReceived", "ChecksRecorded", "HandoffDecided"]
    assert active.candidate("dpo-v5").last_handoff["handoff_status"] == "ready_for_evaluation"  # type: ignore[index]


@pytest.mark.parametrize(
    ("decision", "state", "reasons"),
    [("tune", "tune", ()), ("reject", "reject", ("upstream_reject",)), ("maybe", "reject", ("upstream_state",))],
)
def test_upstream_decision_shapes_handoff(
    ws: Workspace, active: Ledger, decision: str, state: str, reasons: tuple[str, ...]
) -> None:
    """The upstream decision passes the checks but decides tune / reject at hand-off."""
    cid = active.receive(ws.dpo(decision=decision)).candidate.candidate_id  # type: ignore[union-attr]
    assert active.check(cid).state == "verified"
    result = active.hand_off(cid)
    assert result.state == state
    assert result.candidate.reason_codes == reasons  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"evidence_window_index": DROP}, "branch_evidence"),
        ({"evidence_window_index": -5}, "branch_evidence"),
        ({"source_policy_version": "old"}, "source_policy"),
    ],
    ids=["window-missing", "window-expired", "old-baseline"],
)
def test_stale_grpo_evidence_rejects_at_check(ws: Workspace, active: Ledger, overrides: dict, reason: str) -> None:
    """A GRPO candidate with a missing or expired window, or an old baseline, is rejected by its check."""
    cid = active.receive(ws.grpo(**overrides)).candidate.candidate_id  # type: ignore[union-attr]
    result = active.check(cid)
    assert result.state == "reject"
    assert result.candidate.reason_codes == (reason,)  # type: ignore[union-attr]
    assert result.candidate.last_check["freshness"]["failed_checks"] == [reason]  # type: ignore[union-attr,index]


def test_a_kind_that_contradicts_the_semantic_id_rejects_at_check(ws: Workspace, active: Ledger) -> None:
    """A PT-GRPO-GROUPWISE manifest saying `candidate_kind: dpo` (with DPO evidence) would skip the window
    and verifier checks: it fails candidate_kind instead; `rlvr` beside the GRPO id stays an online kind."""
    stale = {"evidence_window_index": -5, "preference_evidence_version": "pref-v5"}
    cid = active.receive(ws.grpo(candidate_kind="dpo", **stale)).candidate.candidate_id  # type: ignore[union-attr]
    result = active.check(cid)
    assert result.state == "reject"
    assert result.candidate.last_check["freshness"]["failed_checks"] == ["candidate_kind"]  # type: ignore[union-attr,index]
    assert active.check(active.receive(ws.rlvr()).candidate.candidate_id).state == "verified"  # type: ignore[union-attr]


def test_new_evaluation_version_fails_evaluation_identity(ws: Workspace, active: Ledger) -> None:
    """After `eval-v2` is activated, a candidate naming eval-v1 fails evaluation_identity on its next check."""
    cid = to_ready(active, ws.dpo())
    assert active.activate_evaluation("eval-v2").invalidated == (cid,)
    result = active.check(cid)
    assert result.state == "reject" and result.candidate.reason_codes == ("evaluation_identity",)  # type: ignore[union-attr]


def test_tampered_candidate_adapter_rejects_with_artifact_evidence(ws: Workspace, active: Ledger) -> None:
    """One flipped byte in the candidate's adapter rejects it; the evidence shows expected != actual."""
    cid = to_ready(active, ws.dpo())
    flip_byte(weights(ws, "dpo-v5"))
    result = active.check(cid)
    assert result.state == "reject" and result.candidate.reason_codes == ("artifact",)  # type: ignore[union-attr]
    stored, event = active.history(cid)[-1]
    assert stored.type == "ChecksRecorded"
    artifact = event.to_payload()["artifact"]
    assert HEX64.fullmatch(artifact["expected"]) and HEX64.fullmatch(artifact["actual"])
    assert artifact["expected"] != artifact["actual"] and artifact["verified"] is False
    assert artifact["expected"] == active.candidate(cid).candidate["adapter_sha256"]


def test_tampered_baseline_adapter_rejects_with_rollback(ws: Workspace, active: Ledger) -> None:
    """A changed baseline adapter means no rollback target: the check rejects with `rollback`."""
    cid = active.receive(ws.dpo()).candidate.candidate_id  # type: ignore[union-attr]
    flip_byte(weights(ws, "sft"))
    result = active.check(cid)
    assert result.state == "reject" and result.candidate.reason_codes == ("rollback",)  # type: ignore[union-attr]


def test_new_baseline_invalidates_decided_candidates_only(ws: Workspace, active: Ledger) -> None:
    """A new baseline sends verified/ready/tune candidates back to received; recovering ones are left alone."""
    verified = active.receive(ws.dpo("dpo-a")).candidate.candidate_id  # type: ignore[union-attr]
    active.check(verified)
    ready = to_ready(active, ws.dpo("dpo-b"))
    tune = to_ready(active, ws.grpo("grpo-t", decision="tune"))
    assert active.candidate(tune).state == "tune"
    recovering = active.receive(ws.rlvr("rlvr-r")).candidate.candidate_id  # type: ignore[union-attr]
    assert active.fail_stage(recovering, "sampling").state == "recovering"
    untouched = active.receive(ws.dpo("dpo-n")).candidate.candidate_id  # type: ignore[union-attr]

    result = active.activate_baseline(ws.baseline("sft2"))
    assert sorted(result.invalidated) == sorted([verified, ready, tune])
    assert [e.type for e in result.events] == ["BaselineActivated"] + ["EvidenceInvalidated"] * 3
    for cid in (verified, ready, tune):
        c = active.candidate(cid)
        assert (c.state, c.reason_codes) == ("received", ("baseline_changed",))
        assert types(active, cid)[-1] == "EvidenceInvalidated"
    assert active.candidate(recovering).state == "recovering"
    assert "EvidenceInvalidated" not in types(active, recovering)
    assert types(active, untouched) == ["CandidateReceived"]
    with pytest.raises(IllegalCommandError):  # the old decision cannot be handed off without a new check
        active.hand_off(ready)


def test_advancing_window_invalidates_only_online_candidates(ws: Workspace, active: Ledger) -> None:
    """`advance_window` invalidates GRPO/RLVR candidates; a DPO candidate stays ready."""
    dpo = to_ready(active, ws.dpo())
    grpo = to_ready(active, ws.grpo())
    rlvr = to_ready(active, ws.rlvr())
    result = active.advance_window(2)
    assert sorted(result.invalidated) == sorted([grpo, rlvr])
    assert active.candidate(dpo).state == "ready"
    assert active.candidate(grpo).reason_codes == ("window_changed",)
    assert active.check(grpo).state == "verified"  # window age 1 is still within the max age 2


def test_same_baseline_again_is_a_noop(ws: Workspace, active: Ledger) -> None:
    """Activating the already-active baseline appends nothing and invalidates nothing."""
    to_ready(active, ws.dpo())
    before = count_events(ws.db)
    result = active.activate_baseline(ws.root / "sft" / "manifest.json")
    assert (result.events, result.invalidated, count_events(ws.db)) == ((), (), before)
    assert active.candidate("dpo-v5").state == "ready"


def test_window_cannot_go_backwards(ws: Workspace, active: Ledger) -> None:
    """A window older than the active one is an input error, and nothing is appended."""
    active.advance_window(3)
    before = count_events(ws.db)
    with pytest.raises(ConflictError, match="only advances"):
        active.advance_window(2)
    assert count_events(ws.db) == before


def test_identical_manifest_received_twice_is_a_noop(ws: Workspace, active: Ledger) -> None:
    """A retried receive with the same manifest succeeds and appends nothing."""
    manifest = ws.dpo()
    active.receive(manifest)
    before = count_events(ws.db)
    again = active.receive(manifest)
    assert again.events == () and again.state == "received" and count_events(ws.db) == before


def test_different_manifest_for_existing_id_conflicts(ws: Workspace, active: Ledger) -> None:
    """Another manifest for a candidate not in tune is a conflict that appends nothing."""
    active.receive(ws.dpo())
    before = count_events(ws.db)
    with pytest.raises(ConflictError, match="only a candidate in tune"):
        active.receive(ws.dpo(evaluation_version="eval-v9"))
    assert count_events(ws.db) == before


def test_revised_manifest_for_tune_candidate_is_revision_one(ws: Workspace, active: Ledger) -> None:
    """A tune candidate accepts a revised manifest: revision 1, back to received."""
    cid = to_ready(active, ws.dpo(decision="tune"))
    assert active.candidate(cid).state == "tune"
    result = active.receive(ws.dpo(decision="accept"))
    assert (result.state, result.candidate.revision) == ("received", 1)  # type: ignore[union-attr]
    assert to_ready(active, ws.root / "dpo-v5" / "manifest.json") == cid
    assert active.candidate(cid).state == "ready"


@pytest.mark.parametrize(
    ("stage", "recorded", "action"),
    [
        ("sampling", "prompt_queue", "retry_sampling_from_prompt_queue"),
        ("sampling", None, "rebuild_prompt_queue"),
        ("reward", "trajectories", "resume_reward_from_saved_trajectories"),
        ("reward", "prompt_queue", "restart_sampling_from_prompt_queue"),
        ("reward", None, "restart_sampling"),
        ("update", "pre_update_checkpoint", "restore_pre_update_checkpoint"),
        ("update", "verified_baseline", "rollback_to_verified_baseline"),
        ("artifact_validation", "verified_baseline", "rollback_to_verified_baseline"),
    ],
)
def test_fail_stage_plans_from_recorded_trusted_state(
    ws: Workspace, active: Ledger, stage: str, recorded: str | None, action: str
) -> None:
    """Each stage resumes from the trusted state recorded in the log, or restarts, per SPEC §3's table."""
    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    if recorded is not None:
        path = ws.root / "sft" / "adapter" if recorded == "verified_baseline" else saved_state(ws, recorded)
        active.record_trusted_state(cid, recorded, path)
    result = active.fail_stage(cid, stage)
    plan = result.candidate.last_recovery  # type: ignore[union-attr]
    assert (plan["stage"], plan["recovery_state"], plan["reused_state"], plan["action"]) == (
        stage,
        recorded,
        recorded is not None,
        action,
    )
    assert result.state == "recovering" and [e.type for e in result.events] == ["StageFailed", "RecoveryPlanned"]
    if recorded is not None:
        assert plan["trusted_states"][recorded]["source"] == "recorded"


@pytest.mark.parametrize("stage", ["update", "artifact_validation"])
def test_verified_baseline_comes_from_active_baseline(ws: Workspace, active: Ledger, stage: str) -> None:
    """Without any recorded state, the intact active baseline is the verified_baseline to roll back to."""
    cid = active.receive(ws.dpo()).candidate.candidate_id  # type: ignore[union-attr]
    result = active.fail_stage(cid, stage)
    plan = result.candidate.last_recovery  # type: ignore[union-attr]
    assert (plan["recovery_state"], plan["action"]) == ("verified_baseline", "rollback_to_verified_baseline")
    assert plan["trusted_states"]["verified_baseline"]["source"] == "active_baseline"
    assert result.state == "recovering"


def test_a_rollback_goes_to_the_candidates_own_baseline_while_it_re_hashes_else_the_active_one(
    ws: Workspace, active: Ledger
) -> None:
    """After a new baseline is activated, a failed update rolls back to the baseline the candidate branched
    from; with that adapter gone, to the active one (both with a note that its checks will fail
    source_policy); with neither, the update is blocked."""
    cid = active.receive(ws.dpo()).candidate.candidate_id  # type: ignore[union-attr]
    active.activate_baseline(ws.baseline("sft2"))
    seen = []
    for gone in (None, "sft", "sft2"):
        if gone is not None:
            shutil.rmtree(ws.root / gone / "adapter")
        plan = active.fail_stage(cid, "update").candidate.last_recovery  # type: ignore[union-attr]
        baseline = plan["trusted_states"]["verified_baseline"]
        seen.append((plan["action"], baseline["source"], Path(baseline["path"]).parent.name, "note" in baseline))
    assert seen == [
        ("rollback_to_verified_baseline", "source_baseline", "sft", True),
        ("rollback_to_verified_baseline", "active_baseline", "sft2", True),
        ("block_update", "active_baseline", "sft2", True),
    ]


def test_a_verified_baseline_is_an_activated_baselines_adapter(ws: Workspace, active: Ledger) -> None:
    """Recorded from the candidate's own adapter (or any other bytes), a rollback would restore what was
    never verified: refused, nothing appended; the activated SFT adapter is recorded."""
    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    before = active.candidate(cid).version
    with pytest.raises(InputError, match="not the adapter of a baseline this ledger activated"):
        active.record_trusted_state(cid, "verified_baseline", ws.root / "grpo-v7" / "adapter")
    assert active.candidate(cid).version == before
    recorded = active.record_trusted_state(cid, "verified_baseline", ws.root / "sft" / "adapter")
    assert recorded.candidate.trusted_states["verified_baseline"]["sha256"] == ws.sft_sha  # type: ignore[union-attr]


def test_a_verified_baseline_recorded_from_other_bytes_is_never_rolled_back_to(ws: Workspace, active: Ledger) -> None:
    """One recorded before the rule (appended here through the store, as an older release could): the
    candidate's own adapter is passed over, and the active baseline serves."""
    from lifecycle_fsm.candidate_events import TrustedStateRecorded
    from lifecycle_fsm.events import stream_of
    from lifecycle_fsm.manifests import utc_now
    from lifecycle_fsm.store.records import NewEvent

    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    own = ws.root / "grpo-v7" / "adapter"
    event = TrustedStateRecorded("verified_baseline", str(own), hash_directory(own))
    row = NewEvent(stream_of(cid), event.TYPE, event.SCHEMA_VERSION, event.to_payload(), "old", utc_now(), "old")
    active.store.append(stream_of(cid), active.candidate(cid).version, [row])
    plan = active.fail_stage(cid, "artifact_validation").candidate.last_recovery  # type: ignore[union-attr]
    assert plan["action"] == "rollback_to_verified_baseline"
    assert plan["trusted_states"]["verified_baseline"]["source"] == "active_baseline"
    assert plan["trusted_states"]["verified_baseline"]["path"] == str(ws.root / "sft" / "adapter")


def test_changed_trusted_state_is_not_trusted(ws: Workspace, active: Ledger) -> None:
    """A trusted state changed on disk after recording is unavailable (expected vs actual); the next one is used."""
    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    trajectories = saved_state(ws, "trajectories")
    active.record_trusted_state(cid, "trajectories", trajectories)
    active.record_trusted_state(cid, "prompt_queue", saved_state(ws, "prompt_queue"))
    flip_byte(trajectories / "state.bin")
    plan = active.fail_stage(cid, "reward").candidate.last_recovery  # type: ignore[union-attr]
    assert plan["action"] == "restart_sampling_from_prompt_queue"
    _, event = active.history(cid)[-1]
    seen = event.to_payload()["trusted_states"]["trajectories"]
    assert seen["available"] is False and seen["source"] == "recorded"
    assert HEX64.fullmatch(seen["expected"]) and HEX64.fullmatch(seen["actual"]) and seen["expected"] != seen["actual"]
    assert event.to_payload()["trusted_states"]["prompt_queue"]["available"] is True


@pytest.mark.parametrize(("stage", "action"), [("update", "block_update"), ("artifact_validation", "block_release")])
def test_blocking_fallback_rejects(ws: Workspace, active: Ledger, stage: str, action: str) -> None:
    """With nothing trusted and the baseline tampered, the blocking fallback rejects the candidate."""
    cid = active.receive(ws.dpo()).candidate.candidate_id  # type: ignore[union-attr]
    flip_byte(weights(ws, "sft"))
    result = active.fail_stage(cid, stage)
    assert result.state == "reject" and result.candidate.reason_codes == (action,)  # type: ignore[union-attr]
    assert result.candidate.last_recovery["blocking"] is True  # type: ignore[union-attr,index]


def test_complete_recovery_returns_to_received(ws: Workspace, active: Ledger) -> None:
    """After the planned recovery the candidate is received again and must pass a new check."""
    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    active.fail_stage(cid, "sampling")
    assert active.complete_recovery(cid).state == "received"
    assert active.check(cid).state == "verified"


def _expect_refused(ws: Workspace, command: object, error: type[Exception] = IllegalCommandError) -> None:
    before = count_events(ws.db)
    with pytest.raises(error):
        command()  # type: ignore[operator]
    assert count_events(ws.db) == before


def test_commands_refused_in_wrong_state_append_nothing(ws: Workspace, active: Ledger) -> None:
    """recovered/handoff on received, fail on ready and everything on reject are refused, appending nothing."""
    received = active.receive(ws.dpo("dpo-r")).candidate.candidate_id  # type: ignore[union-attr]
    _expect_refused(ws, lambda: active.complete_recovery(received))
    _expect_refused(ws, lambda: active.hand_off(received))
    ready = to_ready(active, ws.dpo("dpo-ok"))
    _expect_refused(ws, lambda: active.fail_stage(ready, "update"))
    rejected = active.receive(ws.dpo("dpo-x", source_policy_version="old")).candidate.candidate_id  # type: ignore[union-attr]
    assert active.check(rejected).state == "reject"
    state = saved_state(ws, "prompt_queue")
    for command in (
        lambda: active.check(rejected),
        lambda: active.hand_off(rejected),
        lambda: active.fail_stage(rejected, "sampling"),
        lambda: active.complete_recovery(rejected),
        lambda: active.record_trusted_state(rejected, "prompt_queue", state),
        lambda: active.invalidate_trusted_state(rejected, "prompt_queue"),
    ):
        _expect_refused(ws, command)
    _expect_refused(ws, lambda: active.receive(ws.dpo("dpo-x")), ConflictError)
    assert len(active.history(rejected)) == 2


def test_unknown_inputs_are_refused(ws: Workspace, active: Ledger) -> None:
    """Unknown id -> NotFoundError; unknown stage or trusted kind -> InputError; nothing appended."""
    for command in (lambda: active.check("nope"), lambda: active.hand_off("nope"), lambda: active.candidate("nope")):
        _expect_refused(ws, command, NotFoundError)
    with pytest.raises(NotFoundError) as info:
        active.explain("nope")
    assert info.value.candidate_id == "nope"
    with pytest.raises(NotFoundError) as info:
        active.check("nope")
    assert info.value.candidate_id == "nope"
    cid = active.receive(ws.dpo()).candidate.candidate_id  # type: ignore[union-attr]
    _expect_refused(ws, lambda: active.fail_stage(cid, "inference"), InputError)
    _expect_refused(ws, lambda: active.record_trusted_state(cid, "optimizer", saved_state(ws, "x")), InputError)
    _expect_refused(ws, lambda: active.invalidate_trusted_state(cid, "optimizer"), InputError)


def test_an_unknown_stage_or_kind_names_the_close_one(ws: Workspace, active: Ledger) -> None:
    """A typo is answered with the name meant, in the words the caller wrote, and the names allowed."""
    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    expected = (
        r"^unknown stage 'rewad', did you mean 'reward'\? "
        r"\(expected one of sampling, reward, update, artifact_validation\)$"
    )
    with pytest.raises(InputError, match=expected):
        active.fail_stage(cid, "rewad")
    with pytest.raises(InputError, match=r"^unknown trusted-state kind 'trajectory', did you mean 'trajectories'\?"):
        active.record_trusted_state(cid, "trajectory", saved_state(ws, "x"))
    with pytest.raises(InputError, match=r"^unknown stage 'inference' \(expected one of"):  # nothing close
        active.fail_stage(cid, "inference")


def test_check_before_any_baseline_conflicts(ws: Workspace, ledger: Ledger) -> None:
    """Without an active baseline there is nothing to check lineage against: conflict, nothing appended."""
    ledger.init()
    cid = ledger.receive(ws.dpo()).candidate.candidate_id  # type: ignore[union-attr]
    _expect_refused(ws, lambda: ledger.check(cid), ConflictError)
    _expect_refused(ws, lambda: ledger.hand_off(cid), IllegalCommandError)


def test_event_id_makes_a_retry_a_noop(ws: Workspace, active: Ledger) -> None:
    """Recording a trusted state twice with the same event_id appends one event; the retry is a duplicate."""
    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    state = saved_state(ws, "prompt_queue")
    first = active.record_trusted_state(cid, "prompt_queue", state, event_id="save-42")
    before = count_events(ws.db)
    again = active.record_trusted_state(cid, "prompt_queue", state, event_id="save-42")
    assert count_events(ws.db) == before and again.duplicate and not first.duplicate
    assert [e.seq for e in again.events] == [e.seq for e in first.events]
    assert types(active, cid).count("TrustedStateRecorded") == 1


def test_event_id_reused_with_different_content_is_an_error(ws: Workspace, active: Ledger) -> None:
    """SPEC §5: the same event_id with different content is an error, not a silent duplicate."""
    cid = active.receive(ws.grpo()).candidate.candidate_id  # type: ignore[union-attr]
    active.record_trusted_state(cid, "prompt_queue", saved_state(ws, "prompt_queue"), event_id="save-7")
    before = count_events(ws.db)
    with pytest.raises(DuplicateEventError):
        active.record_trusted_state(cid, "trajectories", saved_state(ws, "trajectories"), event_id="save-7")
    assert count_events(ws.db) == before


def test_logs_one_event_appended_per_event_and_the_decision(ws: Workspace, active: Ledger) -> None:
    """structlog gets one `event_appended` per appended event and a `decision_recorded` naming the state."""
    cid = active.receive(ws.dpo()).candidate.candidate_id  # type: ignore[union-attr]
    active.record_trusted_state(cid, "prompt_queue", saved_state(ws, "prompt_queue"))
    with structlog.testing.capture_logs() as logs:
        result = active.fail_stage(cid, "sampling")
    appended = [entry for entry in logs if entry["event"] == "event_appended"]
    assert [(entry["seq"], entry["type"]) for entry in appended] == [(e.seq, e.type) for e in result.events]
    decisions = [entry for entry in logs if entry["event"] == "decision_recorded"]
    assert len(decisions) == 1
    assert (decisions[0]["candidate_id"], decisions[0]["state"], decisions[0]["seq"]) == (
        cid,
        "recovering",
        result.events[-1].seq,
    )


@pytest.mark.parametrize("key", [5, 5.5, True, b"k", ["k"], "run/\ud800"])
def test_a_key_that_is_not_a_string_is_refused_and_the_ledger_stays_sound(ws: Workspace, key: object) -> None:
    """Before: `check(cid, event_id=5)` hashed the key as 5 and SQLite stored "5": the call returned,
    and from then on `verify` and every read of the candidate failed (exit 6), for good."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        cid = ledger.receive(ws.dpo()).candidate_id
        before = ledger.store.count_events()
        with pytest.raises(InputError, match="event_id"):
            ledger.check(cid, event_id=key)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="event_id"):
            ledger.advance_window(2, event_id=key)  # type: ignore[arg-type]
        assert ledger.store.count_events() == before and verify(ledger.store)["ok"]
        assert ledger.check(cid, event_id="run/1/check").candidate.state == "verified"


@pytest.mark.parametrize("candidate_id", [None, 5, b"dpo-v5", "dpo-\ud800"])
def test_a_candidate_id_that_is_not_a_string_is_an_input_error(ledger: Ledger, candidate_id: object) -> None:
    """Not a TypeError from deep inside: the error tree's InputError, nothing appended."""
    for command in (ledger.check, ledger.candidate, ledger.complete_recovery):
        with pytest.raises(InputError, match="candidate id"):
            command(candidate_id)  # type: ignore[operator]
    assert ledger.store.count_events() == 0


@pytest.mark.parametrize("bad", [None, 5, b"/tmp/x.json"])
def test_a_path_that_is_not_a_path_is_an_input_error(ws: Workspace, ledger: Ledger, bad: object) -> None:
    """Each path argument, and a receive's candidate id: an InputError naming it, nothing appended
    (was `os.fspath`'s bare TypeError: "expected str, bytes or os.PathLike object, not NoneType";
    `receive(..., candidate_id=5)` said "candidate id 5 is empty")."""
    manifest = ws.dpo()
    calls = {
        "manifest path": lambda: ledger.receive(bad),  # type: ignore[arg-type]
        "manifest path ": lambda: ledger.activate_baseline(bad),  # type: ignore[arg-type]
        "trusted-state path": lambda: ledger.record_trusted_state("dpo-v5", "prompt_queue", bad),  # type: ignore[arg-type]
        "the ledger's path or URL": lambda: Ledger.open(bad),  # type: ignore[arg-type]
    }
    if bad is not None:  # None is no root / the manifest's own id
        calls["artifact_root"] = lambda: Ledger.open(ws.db, artifact_root=bad)
        calls["a candidate id is a string"] = lambda: ledger.receive(manifest, candidate_id=bad)  # type: ignore[arg-type]
    for name, call in calls.items():
        with pytest.raises(InputError) as info:
            call()
        assert str(info.value).startswith(name.strip()), str(info.value)
    assert ledger.store.count_events() == 0


@pytest.mark.parametrize("bad", ["/tmp/x\x00.json", "x\x00"])
def test_a_path_holding_a_nul_is_an_input_error(ws: Workspace, ledger: Ledger, bad: str) -> None:
    """No file system path holds a NUL: each path argument was `os.stat`'s bare ValueError ("embedded
    null byte"), or for a trusted state a misleading "no such trusted-state path: /tmp/x .json"; an
    artifact root holding one was accepted, and every artifact under it failed to hash."""
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.dpo())
    before = ledger.store.count_events()
    calls = {
        "manifest path": lambda: ledger.receive(bad),
        "manifest path ": lambda: ledger.activate_baseline(bad),
        "trusted-state path": lambda: ledger.record_trusted_state("dpo-v5", "prompt_queue", bad),
        "the ledger's path or URL": lambda: Ledger.open(bad),
        "artifact_root": lambda: Ledger.open(ws.db, artifact_root=bad),
    }
    for name, call in calls.items():
        with pytest.raises(InputError, match="NUL") as info:
            call()
        assert str(info.value).startswith(name.strip()), str(info.value)
    assert ledger.store.count_events() == before


def test_an_actor_that_is_not_a_string_is_refused(ws: Workspace) -> None:
    """An actor is stored on every event it writes: `actor=5` broke the chain as a key did."""
    with pytest.raises(InputError, match="actor must be a string"):
        ws.ledger(actor=5)
    with pytest.raises(InputError, match=r"actor .* lone surrogate"):
        ws.ledger(actor="sup\ud800")
    assert ws.ledger(actor="supervisor-7").actor == "supervisor-7"


def _hub_snapshot(repo: Path, revision: str, files: dict[str, bytes]) -> Path:
    """A Hugging Face cache repo as the hub writes it: `snapshots/REV/NAME` links to `../../blobs/<sha256>`."""
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / name).symlink_to(os.path.join("..", "..", "blobs", blob))
    return snapshot


def test_trusted_states_are_hashed_under_the_ledgers_artifact_root_like_every_artifact(ws: Workspace) -> None:
    """With `artifact_root`, a Hugging Face snapshot (links into `../../blobs`, all inside the root)
    is received, checked, recorded as a trusted state and re-hashed by `fail_stage` alike: the
    trusted state used to be hashed with the path as its own root ("symlink leads outside the
    allowed root"). A path outside the root is refused like any artifact's."""
    hub = ws.root / "hub"
    adapter = _hub_snapshot(
        hub / "models--org--grpo", "abc", {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": b"w" * 4096}
    )
    checkpoint = _hub_snapshot(hub / "models--org--ckpt", "def", {"model.safetensors": b"c" * 4096})
    sft = ws.baseline(adapter_path="sft/adapter")  # relative paths are read under the artifact root
    sha = hash_directory(adapter, ws.root)
    manifest = candidate_manifest(
        "grpo",
        source_policy_version=ws.sft_sha,
        policy_version="grpo-hub",
        adapter_sha256=sha,
        adapter_path=str(adapter),
    )
    path = ws.write_manifest("grpo-hub", manifest)
    with ws.ledger(artifact_root=ws.root) as ledger:
        ledger.init()
        ledger.activate_baseline(sft)
        assert ledger.receive(path).state is State.RECEIVED
        assert ledger.check("grpo-hub").state is State.VERIFIED
        recorded = ledger.record_trusted_state("grpo-hub", "pre_update_checkpoint", checkpoint)
        assert recorded.candidate.trusted_states["pre_update_checkpoint"]["sha256"] == hash_directory(
            checkpoint, ws.root
        )
        plan = ledger.fail_stage("grpo-hub", "update").plan
        assert (plan.action, plan.recovery_state, plan.path) == (
            RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT,
            "pre_update_checkpoint",
            str(checkpoint),
        )
        outside = ws.root.parent / f"{ws.root.name}-outside"
        outside.mkdir()
        (outside / "queue.jsonl").write_text("{}\n")
        with pytest.raises(ArtifactError, match="escapes root"):
            ledger.record_trusted_state("grpo-hub", "prompt_queue", outside / "queue.jsonl")
        assert "prompt_queue" not in ledger.candidate("grpo-hub").trusted_states


@pytest.mark.parametrize(
    ("actor", "message"),
    [
        (" ", "is blank"),
        ("x" * 257, "over the 256-character limit"),
        (" sup", "starts or ends with whitespace"),
        ("sup\n7", "control or format characters"),
        ("sup\u202e7", "control or format characters"),
    ],
)
def test_an_actor_is_a_name_an_auditor_can_read(ws: Workspace, actor: str, message: str) -> None:
    """Every event names who recorded it: a blank, overlong or look-alike actor is refused, nothing opened."""
    with pytest.raises(InputError, match=message):
        ws.ledger(actor=actor)
    assert not ws.db.exists()
    result = cli(ws.db, "--actor", actor, "init")
    assert result.returncode == 3 and result.stderr.startswith("Error: ") and not ws.db.exists()


@pytest.mark.parametrize(
    "actor",
    [
        "山田\u3000太郎",
        "ops\u00a0bot",
        "Jose\u0301",
        "supervisor 7",
        "\u0639\u0644\u06cc\u200c\u0631\u0636\u0627",
        "ops \U0001f469\u200d\U0001f4bb",
    ],
)
def test_an_actor_in_any_script_with_its_spaces_is_recorded(ws: Workspace, actor: str) -> None:
    with ws.ledger(actor=actor) as ledger:
        assert ledger.init().events[0].actor == actor
    assert cli(ws.db, "--actor", actor, "verify").returncode == 0
    with ws.ledger(actor="") as ledger:  # empty: the default, as before
        assert "@" in ledger.actor
