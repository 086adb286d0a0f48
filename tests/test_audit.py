"""`lifecycle audit` (SPEC §7, seed 000 Step 5): real manifests, real adapters, real ledgers."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import DROP, REPO, Workspace, count_events, run_cli

from lifecycle_fsm.audit_records import canonical_bytes
from lifecycle_fsm.cli import main
from lifecycle_fsm.store.base import event_at


def run_audit(
    ws: Workspace,
    *candidates: Path | str,
    label: str = "t1",
    mode: str = "real_artifact",
    db: Path | None = None,
    root: Path | None = None,
    baseline: Path | None = None,
    extra: tuple[str, ...] = (),
) -> Result:
    args = [
        "--db",
        str(db or ws.db),
        "audit",
        "--baseline",
        str(baseline or ws.root / "sft" / "manifest.json"),
        "--candidates",
        *map(str, candidates),
        "--label",
        label,
        "--mode",
        mode,
        "--root",
        str(root or ws.root),
        "--out",
        str(ws.root / "results"),
        "--json",
        *extra,
    ]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def records(ws: Workspace, label: str = "t1") -> tuple[dict[str, Any], dict[str, Any]]:
    out = ws.root / "results"
    evidence = json.loads((out / f"lifecycle_evidence_{label}.json").read_text())
    handoff = json.loads((out / f"lifecycle_handoff_{label}.json").read_text())
    return evidence, handoff


def by_id(evidence: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["candidate_id"]: r for r in evidence["candidate_records"]}


def tamper(adapter: Path) -> None:
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(b"\x00" + weights.read_bytes()[1:])


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """Manifests written the source workflow's way: adapter paths relative to the project root (`--root`)."""
    return Workspace(tmp_path, paths_from_root=True)


@pytest.fixture
def tree(ws: Workspace) -> tuple[Path, Path]:
    """An SFT baseline, a DPO and a GRPO candidate, all sound."""
    ws.baseline()
    return ws.dpo(), ws.grpo()


def test_all_ready(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """Sound candidates go through receive, check, hand-off: records say ready, citing those events."""
    result = run_audit(ws, *tree)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["handoff_status"] == "ready"
    assert [c["handoff_status"] for c in summary["candidates"]] == ["ready_for_evaluation"] * 2
    evidence, handoff = records(ws)
    assert evidence["schema_version"] == "post-training-lifecycle/v1"
    assert evidence["semantic_id"] == handoff["semantic_id"] == "PT-POST-TRAINING-LIFECYCLE"
    assert evidence["run_mode"] == "real_artifact" and evidence["run_label"] == "t1"
    assert evidence["active_policy_version"] == ws.sft_sha
    assert handoff["handoff_status"] == "ready" and handoff["source_evidence"] == "lifecycle_evidence_t1.json"
    assert handoff["candidate_records"] == evidence["candidate_records"]
    assert handoff["baseline_manifest"] == "manifest.json"
    dpo = by_id(evidence)["dpo-v5"]
    assert dpo["path"] == dpo["manifest_path"] == "../dpo-v5/manifest.json"
    assert dpo["semantic_id"] == "PT-DPO-OFFLINE" and dpo["upstream_decision"] == "accept"
    assert dpo["freshness"] == {"fresh": True, "failed_checks": []}
    manifest = json.loads(tree[0].read_text())
    assert dpo["artifact"] == manifest["artifacts"]["adapter"] and dpo["artifact"]["path"] == "dpo-v5/adapter"
    sha = manifest["artifacts"]["adapter"]["sha256"]
    assert dpo["evidence"] == {
        "rollback_ready": True,
        "artifact_verified": True,
        "artifact_check": {"expected": sha, "actual": sha},
        "rollback_check": {"expected": ws.sft_sha, "actual": ws.sft_sha},
    }
    assert dpo["artifact_detail"]["path"] == "dpo-v5/adapter" and dpo["artifact_detail"]["actual"] == sha
    assert dpo["rollback_detail"]["expected"] == dpo["rollback_detail"]["actual"] == ws.sft_sha
    assert dpo["inconclusive"] == []
    assert (dpo["hard_failures"], dpo["ledger_state"]) == ([], "ready")
    assert [e["type"] for e in dpo["ledger_events"]] == ["CandidateReceived", "ChecksRecorded", "HandoffDecided"]
    assert dpo["evidence_seq"] == dpo["ledger_events"][-1]["seq"]
    assert [e["type"] for e in evidence["ledger_events"]] == ["LedgerInitialized", "BaselineActivated"]
    raw = (ws.root / "results" / "lifecycle_evidence_t1.json").read_bytes()
    assert raw == canonical_bytes(evidence) and raw.endswith(b"}\n")
    with ws.ledger() as ledger:
        assert ledger.candidate("grpo-v7").state == "ready"
        assert event_at(ledger.store, dpo["evidence_seq"]).type == "HandoffDecided"  # type: ignore[union-attr]


def test_grpo_window_expired(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """--active-window 4 ages GRPO evidence from window 1 past 2: branch_evidence; DPO is still ready."""
    result = run_audit(ws, tree[0], extra=("--active-window", "4", "--candidates", str(tree[1])))
    assert result.exit_code == 0, result.stderr
    evidence, handoff = records(ws)
    grpo = by_id(evidence)["grpo-v7"]
    assert grpo["handoff_status"] == "reject" and grpo["freshness"]["failed_checks"] == ["branch_evidence"]
    assert grpo["hard_failures"] == ["freshness"] and grpo["reason_codes"] == ["branch_evidence"]
    assert by_id(evidence)["dpo-v5"]["handoff_status"] == "ready_for_evaluation"
    assert handoff["handoff_status"] == "ready" and evidence["active_window"] == 4


def test_grpo_without_window_index(ws: Workspace) -> None:
    """A GRPO manifest with no evidence_window_index is never fresh by default: branch_evidence."""
    ws.baseline()
    result = run_audit(ws, ws.grpo(evidence_window_index=DROP))
    assert result.exit_code == 0, result.stderr
    evidence, handoff = records(ws)
    assert by_id(evidence)["grpo-v7"]["reason_codes"] == ["branch_evidence"]
    assert handoff["handoff_status"] == "no_ready_candidate"


@pytest.mark.parametrize(
    ("decision", "status", "hard"), [("tune", "tune", []), ("reject", "reject", ["upstream_reject"])]
)
def test_upstream_decision_propagates(ws: Workspace, decision: str, status: str, hard: list[str]) -> None:
    """Upstream tune stays tune (re-checked next audit); upstream reject rejects (kept as it stands)."""
    ws.baseline()
    manifest = ws.dpo(decision=decision)
    for label, next_events in (
        ("t1", ["CandidateReceived", "ChecksRecorded", "HandoffDecided"]),
        ("t2", ["ChecksRecorded"] if status == "tune" else []),
    ):
        result = run_audit(ws, manifest, label=label)
        assert result.exit_code == 0, result.stderr
        evidence, handoff = records(ws, label)
        dpo = by_id(evidence)["dpo-v5"]
        assert (dpo["handoff_status"], dpo["hard_failures"], dpo["reason_codes"]) == (status, hard, hard)
        assert dpo["upstream_decision"] == decision and dpo["ledger_state"] == status
        assert [e["type"] for e in dpo["ledger_events"]] == next_events
        assert handoff["handoff_status"] == "no_ready_candidate"


def test_baseline_tampered_rejects_every_candidate(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """A baseline adapter that no longer matches its manifest fails every candidate's rollback."""
    tamper(ws.root / "sft" / "adapter")
    assert run_audit(ws, *tree).exit_code == 0
    evidence, handoff = records(ws)
    for record in evidence["candidate_records"]:
        assert record["handoff_status"] == "reject" and record["reason_codes"] == ["rollback"]
        assert record["rollback_detail"]["expected"] == ws.sft_sha != record["rollback_detail"]["actual"]
        assert record["rollback_detail"]["error"] == "hash_mismatch"
        assert record["evidence"]["rollback_ready"] is False and record["evidence"]["artifact_verified"] is True
        assert record["evidence"]["rollback_check"] == {
            "expected": ws.sft_sha,
            "actual": record["rollback_detail"]["actual"],
        }
    assert handoff["handoff_status"] == "no_ready_candidate"


def test_candidate_tampered_and_old_baseline(ws: Workspace) -> None:
    """A tampered candidate adapter fails artifact; one from an old baseline fails source_policy."""
    ws.baseline()
    dpo, grpo = ws.dpo(), ws.grpo(source_policy_version="0" * 64)
    tamper(ws.root / "dpo-v5" / "adapter")
    assert run_audit(ws, dpo, grpo).exit_code == 0
    found = by_id(records(ws)[0])
    assert found["dpo-v5"]["reason_codes"] == ["artifact"] and found["dpo-v5"]["hard_failures"] == ["artifact"]
    checked = found["dpo-v5"]["evidence"]["artifact_check"]
    assert checked["actual"] != checked["expected"] == found["dpo-v5"]["artifact"]["sha256"]
    assert found["dpo-v5"]["evidence"]["artifact_verified"] is False
    assert found["grpo-v7"]["reason_codes"] == ["source_policy"]


def test_missing_manifests(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """A missing candidate manifest is listed, not fatal; with none existing nothing is written."""
    result = run_audit(ws, tree[0], ws.root / "rlvr" / "manifest.json")
    assert result.exit_code == 0, result.stderr
    evidence, _ = records(ws)
    assert evidence["missing_candidate_manifests"] == ["../rlvr/manifest.json"]
    assert list(by_id(evidence)) == ["dpo-v5"]
    db = ws.root / "other.db"
    result = run_audit(ws, ws.root / "nope.json", label="t2", db=db)
    assert result.exit_code == 3 and "no candidate manifest exists" in result.stderr
    assert not db.exists() and not (ws.root / "results" / "lifecycle_evidence_t2.json").exists()


def test_bad_json_writes_nothing(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """A candidate manifest that is not JSON is an input error: no ledger file, no records."""
    bad = ws.root / "bad.json"
    bad.write_text("{not json")
    result = run_audit(ws, tree[0], bad)
    assert result.exit_code == 3 and result.stderr.startswith("Error: ") and "not valid JSON" in result.stderr
    assert not ws.db.exists() and not (ws.root / "results").exists()


@pytest.mark.parametrize("label", ["../x", "a b", "é", ""])
def test_bad_label(ws: Workspace, tree: tuple[Path, Path], label: str) -> None:
    """A label outside [A-Za-z0-9._-]+ is an input error, before anything is touched."""
    result = run_audit(ws, *tree, label=label)
    assert result.exit_code == 3 and "label must match" in result.stderr and not ws.db.exists()


def test_paths_escaping_root_are_not_read(tmp_path: Path) -> None:
    """An adapter path leaving --root is rejected unread (path_escapes_root), even with the right bytes."""
    ws = Workspace(tmp_path / "inside", paths_from_root=True)
    outside = Workspace(tmp_path).adapter("outside")
    ws.baseline()
    good = ws.grpo()
    escaping = {"path": "../outside/adapter", "sha256": ws_hash(outside)}
    dpo = ws.dpo(artifacts={"adapter": escaping})
    assert run_audit(ws, dpo, good).exit_code == 0
    found = by_id(records(ws)[0])
    assert found["dpo-v5"]["reason_codes"] == ["artifact", "path_escapes_root"]
    assert found["dpo-v5"]["artifact"] == escaping
    assert found["dpo-v5"]["artifact_detail"] == {
        "path": "../outside/adapter",
        "expected": escaping["sha256"],
        "actual": None,
        "verified": False,
        "error": "path_escapes_root",
    }
    assert found["grpo-v7"]["handoff_status"] == "ready_for_evaluation"
    # The baseline leaving the root: every candidate fails rollback.
    sft = ws.write_manifest("sft2", {"artifacts": {"adapter": escaping}})
    result = run_audit(ws, good, label="t2", db=ws.root / "b.db", baseline=sft)
    assert result.exit_code == 0, result.stderr
    grpo = by_id(records(ws, "t2")[0])["grpo-v7"]
    assert "rollback" in grpo["reason_codes"] and "path_escapes_root" in grpo["reason_codes"]
    assert grpo["rollback_detail"]["error"] == "path_escapes_root" and grpo["rollback_detail"]["actual"] is None
    assert grpo["evidence"]["rollback_check"] == {"expected": escaping["sha256"], "actual": None}


def ws_hash(path: Path) -> str:
    from lifecycle_fsm.artifacts import hash_directory

    return hash_directory(path)


def test_symlinks_inside_root_followed_outside_refused(tmp_path: Path) -> None:
    """A link into a blob inside --root proves the blob's bytes; a link leading outside fails artifact."""
    ws = Workspace(tmp_path / "inside", paths_from_root=True)
    ws.baseline()
    grpo, dpo = ws.grpo(), ws.dpo()
    for name, target in (("grpo-v7", ws.root / "blobs" / "w1"), ("dpo-v5", tmp_path / "elsewhere" / "w2")):
        weights = ws.root / name / "adapter" / "adapter_model.safetensors"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(weights, target)
        weights.symlink_to(target)
    assert run_audit(ws, grpo, dpo).exit_code == 0
    found = by_id(records(ws)[0])
    assert found["grpo-v7"]["handoff_status"] == "ready_for_evaluation"  # a link and a copy hash the same
    assert found["dpo-v5"]["reason_codes"] == ["artifact"]
    assert found["dpo-v5"]["artifact_detail"]["error"] == "symlink_outside_root"
    blob = ws.root / "blobs" / "w1"  # rewrite the bytes the link points to
    blob.write_bytes(b"changed" + blob.read_bytes())
    assert run_audit(ws, grpo, label="t2").exit_code == 0
    again = by_id(records(ws, "t2")[0])["grpo-v7"]
    assert again["reason_codes"] == ["artifact"] and again["ledger_state"] == "reject"
    assert again["evidence"]["artifact_check"]["actual"] != found["grpo-v7"]["evidence"]["artifact_check"]["actual"]
    assert [e["type"] for e in again["ledger_events"]] == ["ChecksRecorded"]  # ready is re-checked, not re-received


def test_dry_run_writes_nothing(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """dry_run (the default) parses, checks fields and paths, prints the plan; no ledger file, no records."""
    grpo = ws.grpo("grpo-v8", evidence_window_index=DROP)
    baseline, out, gone = ws.root / "sft" / "manifest.json", ws.root / "results", ws.root / "gone.json"
    args = [
        "--db",
        str(ws.db),
        "audit",
        "--baseline",
        str(baseline),
        "--candidates",
        str(tree[0]),
        str(grpo),
        str(gone),
        "--label",
        "d",
        "--out",
        str(out),
        "--root",
        str(ws.root),
    ]
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["run_mode"] == "dry_run" and plan["blockers"] == []
    dpo, grpo_plan = plan["candidates"]
    assert dpo["missing_fields"] == []
    assert dpo["artifact"] == {"path": "dpo-v5/adapter", "escapes_root": False, "exists": True}
    assert grpo_plan["missing_fields"] == ["evidence_window_index"]
    assert grpo_plan["freshness_preview"]["failed_checks"] == ["branch_evidence"]
    assert plan["missing_candidate_manifests"] == ["../gone.json"]
    text = CliRunner().invoke(main, args, catch_exceptions=False)
    assert text.exit_code == 0 and "nothing is written" in text.stdout
    assert not ws.db.exists() and not (ws.root / "results").exists()


def test_repeated_label_refused_and_replace(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """A used label is refused (exit 3, nothing appended); --replace keeps one .previous generation."""
    assert run_audit(ws, *tree).exit_code == 0
    out = ws.root / "results"
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    events = count_events(ws.db)
    again = run_audit(ws, *tree)
    assert again.exit_code == 3 and "lifecycle_evidence_t1.json" in again.stderr
    assert count_events(ws.db) == events and {p.name: p.read_bytes() for p in out.iterdir()} == first
    tamper(ws.root / "dpo-v5" / "adapter")
    assert run_audit(ws, *tree, extra=("--replace",)).exit_code == 0
    for name, data in first.items():
        assert (out / f"{name}.previous").read_bytes() == data
    assert by_id(records(ws)[0])["dpo-v5"]["handoff_status"] == "reject"
    events = count_events(ws.db)
    third = run_audit(ws, *tree, extra=("--replace",))
    assert third.exit_code == 3 and ".previous already exists" in third.stderr and count_events(ws.db) == events


def test_an_out_folder_that_cannot_be_written_appends_nothing(
    ws: Workspace, tree: tuple[Path, Path], read_only_folder: Path
) -> None:
    """`--out` under a file (or read-only) is refused before the first append: the ledger's bytes stay the same.

    The run used to append init, baseline, receive, check and hand-off, then fail at the records (exit 3).
    """
    (ws.root / "afile").write_text("x")
    locked = read_only_folder
    fresh = ws.root / "fresh.db"
    refused = run_audit(ws, *tree, db=fresh, extra=("--out", str(ws.root / "afile" / "sub")))
    assert refused.exit_code == 3 and not fresh.exists(), refused.output
    assert run_audit(ws, *tree).exit_code == 0  # a ledger with events; a second audit would re-check both
    before, events = ws.db.read_bytes(), count_events(ws.db)
    outs = [
        (ws.root / "afile" / "sub", "cannot create records folder"),
        (locked / "sub", "cannot create records folder"),
        (locked, "cannot write in records folder"),
    ]
    for out, message in outs:
        result = run_audit(ws, *tree, label="t2", extra=("--out", str(out)))
        assert result.exit_code == 3 and result.stderr.startswith(f"Error: {message} {out}: "), result.output
        assert result.stderr.count("\n") == 1 and result.stdout == ""
        assert count_events(ws.db) == events and ws.db.read_bytes() == before


@pytest.mark.parametrize("signed", [False, True], ids=["no-key", "signing-key"])
def test_records_byte_identical_across_folders_apart_from_the_heads(
    ws: Workspace, tree: tuple[Path, Path], tmp_path: Path, signed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same manifests and artifacts in two folders, two fresh ledgers, seconds apart: identical bytes
    apart from `ledger_head` and (with a key) `signed_head`, which are present and differ (README, SPEC §8)."""
    head_fields = ("ledger_head", "signed_head") if signed else ("ledger_head",)
    if signed:
        keys = tmp_path / "keys"
        assert CliRunner().invoke(main, ["key", "new", "--out", str(keys)]).exit_code == 0
        monkeypatch.setenv("LIFECYCLE_SIGNING_KEY", str(keys / "lifecycle-signing.key"))
    outputs = []
    for i, folder in enumerate((tmp_path / "copy-a" / "x", tmp_path / "copy-b")):
        shutil.copytree(ws.root, folder, ignore=shutil.ignore_patterns("copy-*", "keys"))
        copy = Workspace(folder)
        result = run_audit(
            copy,
            folder / "dpo-v5" / "manifest.json",
            folder / "grpo-v7" / "manifest.json",
            folder / "missing" / "manifest.json",
        )
        assert result.exit_code == 0, result.stderr
        outputs.append([(folder / "results" / f"lifecycle_{k}_t1.json").read_bytes() for k in ("evidence", "handoff")])
        if i == 0:
            time.sleep(1.1)  # the wall clock moves: event timestamps differ, the records must not
    heads = []  # per audit: the head fields, the same in its evidence and its hand-off record
    for pair in outputs:
        docs = [json.loads(raw) for raw in pair]
        assert all(set(head_fields) <= doc.keys() for doc in docs)
        assert signed or all("signed_head" not in doc for doc in docs)
        assert all(docs[0][f] == docs[1][f] for f in head_fields)  # evidence and hand-off agree on them
        assert all(raw == canonical_bytes(doc) for raw, doc in zip(pair, docs, strict=True))  # canonical JSON
        heads.append({f: docs[0][f] for f in head_fields})
    # Everything else is byte-for-byte the same: the records with those fields removed, re-serialised
    # canonically (the files are canonical JSON, so this is their bytes minus those fields).
    stripped = [
        [canonical_bytes({k: v for k, v in json.loads(raw).items() if k not in head_fields}) for raw in pair]
        for pair in outputs
    ]
    assert stripped[0] == stripped[1]
    # The head fields themselves: the same position, a different chain (ledger id and timestamps differ).
    assert heads[0]["ledger_head"]["seq"] == heads[1]["ledger_head"]["seq"]
    assert heads[0]["ledger_head"]["hash"] != heads[1]["ledger_head"]["hash"]
    assert outputs[0] != outputs[1]  # so the files as a whole are not byte-identical
    if signed:
        for head in heads:
            sealed = head["signed_head"]
            assert (sealed["seq"], sealed["hash"]) == (head["ledger_head"]["seq"], head["ledger_head"]["hash"])
        assert heads[0]["signed_head"]["ledger_id"] != heads[1]["signed_head"]["ledger_id"]
        assert heads[0]["signed_head"]["signature"] != heads[1]["signed_head"]["signature"]
    assert b"copy-" not in outputs[0][0] and str(tmp_path).encode() not in outputs[0][0]


def test_recovery_scenarios_follow_the_table(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """The four failures go through the ordered table (recovery_state) and carry the source workflow's
    run variant keys (required_state: the trusted state the stage needs)."""
    assert run_audit(ws, *tree).exit_code == 0
    evidence, handoff = records(ws)
    expected = [
        ("sampling", "prompt_queue", "retry_sampling_from_prompt_queue"),
        ("reward", "trajectories", "resume_reward_from_saved_trajectories"),
        ("update", "pre_update_checkpoint", "restore_pre_update_checkpoint"),
        ("artifact_validation", "verified_baseline", "rollback_to_verified_baseline"),
    ]
    assert (
        evidence["recovery_scenarios"]
        == handoff["recovery_scenarios"]
        == [
            {
                "stage": s,
                "available": {state: True},
                "required_state": state,
                "recovery_state": state,
                "reused_state": True,
                "action": a,
            }
            for s, state, a in expected
        ]
    )


def test_existing_ledger_settings_and_states(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """Conflicting settings are refused before any append; reject/recovering are recorded as they stand."""
    ws.grpo("grpo-old", source_policy_version="0" * 64)
    with ws.ledger() as ledger:
        ledger.init(3, 1)
    assert run_audit(ws, *tree).exit_code == 5 and count_events(ws.db) == 1
    with ws.ledger() as ledger:
        ledger.advance_window(2)
    result = run_audit(ws, *tree, extra=("--max-window-age", "3"))
    assert result.exit_code == 5 and "only advances" in result.stderr and count_events(ws.db) == 2
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.root / "sft" / "manifest.json")
        ledger.receive(tree[1])
        ledger.fail_stage("grpo-v7", "sampling")  # recovering
        ledger.receive(ws.root / "grpo-old" / "manifest.json")
        rejected_at = ledger.check("grpo-old").events[-1].seq
    events = count_events(ws.db)
    result = run_audit(
        ws,
        tree[0],
        tree[1],
        ws.root / "grpo-old" / "manifest.json",
        extra=("--max-window-age", "3", "--active-window", "3"),
    )
    assert result.exit_code == 0, result.stderr
    evidence, handoff = records(ws)
    found = by_id(evidence)
    assert (found["grpo-v7"]["ledger_state"], found["grpo-v7"]["handoff_status"]) == ("recovering", None)
    assert found["grpo-v7"]["ledger_events"] == [] and found["grpo-old"]["ledger_events"] == []
    assert found["grpo-old"]["ledger_state"] == "reject" and found["grpo-old"]["evidence_seq"] == rejected_at
    assert found["grpo-old"]["reason_codes"] == ["source_policy"]
    assert found["dpo-v5"]["handoff_status"] == "ready_for_evaluation" and handoff["handoff_status"] == "ready"
    assert [e["type"] for e in evidence["ledger_events"]] == ["WindowAdvanced"]
    assert count_events(ws.db) == events + 4  # window + dpo received, checked, handed off


def test_changed_manifest_for_a_decided_id_is_refused(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """A different manifest under an id the ledger already decided is a conflict, before any append."""
    assert run_audit(ws, *tree).exit_code == 0
    ws.dpo(evaluation_version="eval-v2")
    events = count_events(ws.db)
    result = run_audit(ws, *tree, label="t2")
    assert result.exit_code == 5 and "dpo-v5" in result.stderr and count_events(ws.db) == events


def test_make_fixtures_then_audit_subprocess(tmp_path: Path) -> None:
    """examples/make_fixtures.py builds a tree whose real_artifact audit (a real process) is ready."""
    demo = tmp_path / "demo"
    made = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_fixtures.py"), str(demo)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    command = shlex.split(made.stdout.strip().splitlines()[-1])
    assert command[:2] == ["lifecycle", "--db"] and "audit" in command
    weights = list(demo.glob("outputs/*/adapter/adapter_model.safetensors"))
    assert len(weights) == 3 and all(w.stat().st_size > 1_000_000 for w in weights)
    env = {**os.environ, "LIFECYCLE_LOG_LEVEL": "error"}
    done = subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", *command[1:], "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["handoff_status"] == "ready"
    assert {c["candidate_id"] for c in summary["candidates"]} == {"dpo_offline_len1024_v5", "grpo_rlvr_len384_v7"}
    assert json.loads(Path(summary["handoff_path"]).read_text())["handoff_status"] == "ready"


def test_records_carry_the_ledger_head_and_with_a_key_a_signed_head(ws: Workspace, tree: tuple[Path, Path]) -> None:
    """SPEC §8: ledger_head is the head after the audit's events; a key seals it and the seal verifies."""
    keys = ws.root / "keys"
    assert CliRunner().invoke(main, ["key", "new", "--out", str(keys)]).exit_code == 0
    result = run_audit(ws, *tree, extra=())
    assert result.exit_code == 0
    evidence, handoff = records(ws)
    assert "signed_head" not in evidence and evidence["ledger_head"] == handoff["ledger_head"]
    with sqlite3.connect(ws.db) as conn:
        head = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    assert (evidence["ledger_head"]["seq"], evidence["ledger_head"]["hash"]) == head
    args = [
        "--signing-key",
        str(keys / "lifecycle-signing.key"),
        "--db",
        str(ws.db),
        "audit",
        "--baseline",
        str(ws.root / "sft" / "manifest.json"),
        "--candidates",
        *map(str, tree),
        "--label",
        "t2",
        "--mode",
        "real_artifact",
        "--root",
        str(ws.root),
        "--out",
        str(ws.root / "results"),
    ]
    assert CliRunner().invoke(main, args, catch_exceptions=False).exit_code == 0
    evidence, handoff = records(ws, "t2")
    signed = evidence["signed_head"]
    assert signed == handoff["signed_head"]
    assert (signed["seq"], signed["hash"]) == (evidence["ledger_head"]["seq"], evidence["ledger_head"]["hash"])
    pin = ws.root / "head.json"
    pin.write_text(json.dumps(signed))
    check = [
        "--db",
        str(ws.db),
        "verify",
        "--json",
        "--expect-head",
        str(pin),
        "--pubkey",
        str(keys / "lifecycle-signing.pub"),
    ]
    report = json.loads(CliRunner().invoke(main, check, catch_exceptions=False).stdout)
    assert report["ok"] is True and report["seals"]["count"] == 1 and report["seals"]["last_seq"] == signed["seq"] + 1


@pytest.mark.parametrize("key", ["public", "missing"])
def test_a_bad_signing_key_is_refused_before_the_out_folder_is_made(
    ws: Workspace, tree: tuple[Path, Path], key: str
) -> None:
    """A `real_artifact` audit with a key it cannot use (a public key, no file) was refused (exit 3) after it had
    created `--out` to prove it writable: a refused command left an empty records folder. The key is read first."""
    keys = ws.root / "keys"
    assert CliRunner().invoke(main, ["key", "new", "--out", str(keys)]).exit_code == 0
    given = keys / ("lifecycle-signing.pub" if key == "public" else "nope.key")
    out = ws.root / "new" / "results"
    args = [
        "--signing-key",
        str(given),
        "--db",
        str(ws.db),
        "audit",
        "--baseline",
        str(ws.root / "sft" / "manifest.json"),
        "--candidates",
        *map(str, tree),
        "--label",
        "t3",
        "--mode",
        "real_artifact",
        "--root",
        str(ws.root),
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 3 and result.stderr.startswith("Error: "), result.output
    assert not out.parent.exists() and not ws.db.exists()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--baseline", "b.json", "--candidates", "--label", "L"], "--candidates"),
        (["--baseline", "--candidates", "a.json", "--label", "L"], "--baseline"),
        (
            ["--baseline", "b.json", "--candidates", "a.json", "--mode", "real_artifact", "--out", "--label", "L"],
            "--out",
        ),
        (["--baseline", "b.json", "--candidates", "a.json", "--label", "L", "--root", "--replace"], "--root"),
    ],
)
def test_an_option_taken_as_a_path_is_a_usage_error(tmp_path: Path, args: list[str], option: str) -> None:
    """`--candidates --label L` gave `--candidates` the path `--label` (then listed as missing, not
    fatal) and `L` as a candidate: exit 2 naming the option now, nothing written or appended."""
    db = tmp_path / "ledger.db"
    done = run_cli(db, "audit", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"'{option}'" in lines[0] and "not the option" in lines[0]
    assert not db.exists()
    assert list(tmp_path.iterdir()) == []


def test_an_audit_under_another_root_names_the_path_that_differs(ws: Workspace, tmp_path: Path) -> None:
    """The same manifest file read without the root it was first audited under resolves its adapter
    elsewhere: refused before anything is appended, naming that path, not only "a different manifest"."""
    project = tmp_path / "project"
    tree = Workspace(project, paths_from_root=True)
    project.mkdir(exist_ok=True)
    sft, dpo = tree.baseline(), tree.dpo()
    args = ["audit", "--baseline", str(sft), "--candidates", str(dpo), "--mode", "real_artifact"]

    def invoke(*more: str) -> Result:
        return CliRunner().invoke(main, ["--db", str(ws.db), *more], catch_exceptions=False)

    first = invoke(*args, "--label", "a1", "--root", str(project), "--out", str(tmp_path / "out"))
    assert first.exit_code == 0, first.stderr
    before = count_events(ws.db)
    again = invoke(*args, "--label", "a2", "--root", str(tmp_path), "--out", str(tmp_path / "out"))
    assert again.exit_code == 5 and count_events(ws.db) == before
    assert f"adapter_resolved_path was '{project}/dpo-v5/adapter', is '{tmp_path}/dpo-v5/adapter'" in again.stderr
