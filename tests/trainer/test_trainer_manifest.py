"""The public candidate-manifest builder: what it writes is what the ledger reads, received and verified.

No training stack needed: these run in every venv.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from lifecycle_fsm import InputError, State
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.manifests import candidate_manifest, load_candidate_manifest, write_manifest
from lifecycle_fsm.replay.drills.workspace import write_adapter
from tests.conftest import Workspace

EVIDENCE: dict[str, dict[str, Any]] = {
    "dpo": {"source_evidence_version": "pref-train-v3"},
    "grpo": {"verifier_version": "math-v2", "evidence_window_index": 1},
    "rlvr": {"verifier_version": "unit-tests-v1", "evidence_window_index": 1},
}


def _built(ws: Workspace, kind: str, **fields: Any) -> Path:
    adapter = write_adapter(ws.root / "run" / "adapter", "run", b"weights" * 100)
    manifest = candidate_manifest(
        candidate_id=f"{kind}-run-1",
        kind=kind,
        source_policy_version=str(ws.sft_sha),
        adapter_path="adapter",
        adapter_sha256=hash_directory(adapter),
        evaluation_version="eval-v1",
        decision="accept",
        **(EVIDENCE[kind] | fields),
    )
    return write_manifest(ws.root / "run" / "manifest.json", manifest)


@pytest.mark.parametrize("kind", ["dpo", "grpo", "rlvr"])
def test_a_built_manifest_is_received_and_checked_verified(ws: Workspace, kind: str) -> None:
    """Every field the checks read is there, spelled as the reader reads it: the real ledger verifies it."""
    baseline = ws.baseline()
    path = _built(ws, kind)
    with ws.ledger() as ledger:
        ledger.init()
        ledger.activate_baseline(baseline)
        ledger.activate_evaluation("eval-v1")
        received = ledger.receive(path)
        assert received.candidate_id == f"{kind}-run-1"  # the candidate id is the manifest's policy_version
        assert received.candidate.kind == kind
        checked = ledger.check(received.candidate_id)
    assert checked.state is State.VERIFIED, checked.candidate.reason_codes


def test_fields_as_the_reader_sees_them(ws: Workspace) -> None:
    ws.baseline()
    fields = load_candidate_manifest(_built(ws, "rlvr")).fields
    assert fields["candidate_kind"] == "rlvr" and fields["semantic_id"] == "PT-GRPO-GROUPWISE"
    assert fields["verifier_version"] == "unit-tests-v1" and fields["evidence_window_index"] == 1
    assert fields["source_policy_version"] == ws.sft_sha and fields["decision"] == "accept"


def test_extra_fields_are_added_or_replace_built_ones(ws: Workspace) -> None:
    ws.baseline()
    fields = load_candidate_manifest(_built(ws, "dpo", policy_version="dpo-v9", run_label="nightly")).fields
    assert fields["policy_version"] == "dpo-v9"
    manifest = json.loads((ws.root / "run" / "manifest.json").read_text())
    assert manifest["run_label"] == "nightly"


@pytest.mark.parametrize(
    ("kind", "evidence", "named"),
    [
        ("dpo", {}, "source_evidence_version"),
        ("grpo", {"evidence_window_index": 1}, "verifier_version"),
        ("rlvr", {"verifier_version": "v1"}, "evidence_window_index"),
        ("grpo", {"verifier_version": "v1", "evidence_window_index": True}, "evidence_window_index"),
        ("ppo", {}, "unknown candidate kind 'ppo'"),
    ],
)
def test_missing_branch_evidence_is_refused_before_anything_is_written(
    kind: str, evidence: dict[str, Any], named: str
) -> None:
    """A forgotten field would have the candidate rejected for good; the builder says which one instead."""
    with pytest.raises(InputError, match=named):
        candidate_manifest(
            candidate_id="c",
            kind=kind,
            source_policy_version="s",
            adapter_path="a",
            adapter_sha256="0" * 64,
            evaluation_version="e",
            decision="accept",
            **evidence,
        )


def test_write_manifest_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    """A writer that fails midway leaves the old manifest and no temporary file behind."""
    target = write_manifest(tmp_path / "m" / "manifest.json", {"decision": "accept"})
    assert os.stat(target).st_mode & 0o777 == 0o644
    with pytest.raises(TypeError):
        write_manifest(target, {"decision": object()})
    assert json.loads(target.read_text()) == {"decision": "accept"}
    assert sorted(p.name for p in target.parent.iterdir()) == ["manifest.json"]
    write_manifest(target, {"decision": "tune"})
    assert json.loads(target.read_text()) == {"decision": "tune"}
