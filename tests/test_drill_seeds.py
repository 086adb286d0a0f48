"""The one manifest factory (`lifecycle_fsm.replay.drills.workspace`): what it writes, `manifests` reads as fresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.manifests import load_baseline_manifest, load_candidate_manifest, write_manifest
from lifecycle_fsm.replay.drills.workspace import baseline_manifest, candidate_manifest, write_adapter
from lifecycle_fsm.rules import CANDIDATE_KINDS, check_candidate_freshness


@pytest.mark.parametrize("kind", CANDIDATE_KINDS)
def test_default_candidate_is_fresh_against_its_baseline(tmp_path: Path, kind: str) -> None:
    """A baseline and a candidate built with defaults read back as the same kind, fresh, hash verified."""
    sft = hash_directory(write_adapter(tmp_path / "sft" / "adapter", "sft", b"base weights"))
    baseline = load_baseline_manifest(write_manifest(tmp_path / "sft" / "manifest.json", baseline_manifest(sft)))
    adapter = write_adapter(tmp_path / "cand" / "adapter", "cand", b"candidate weights")
    manifest = candidate_manifest(
        kind,
        source_policy_version=baseline.adapter_sha256,
        policy_version="cand-v1",
        adapter_sha256=hash_directory(adapter),
    )
    fields = load_candidate_manifest(write_manifest(tmp_path / "cand" / "manifest.json", manifest)).fields
    assert fields["candidate_kind"] == kind
    assert hash_directory(fields["adapter_resolved_path"]) == fields["adapter_sha256"]
    window_age = 1 - fields["evidence_window_index"] if kind != "dpo" else None
    freshness = check_candidate_freshness(fields | {"window_age": window_age}, sft, 2)
    assert freshness == {"fresh": True, "failed_checks": []}


def test_fields_replace_in_place_and_add_at_the_end() -> None:
    """Keyword fields override a default where it stands (bytes stay stable) or append new keys."""
    manifest = candidate_manifest(
        "grpo",
        source_policy_version="s",
        policy_version="p",
        adapter_sha256="a",
        evidence_window_index=None,
        run_label="r",
    )
    assert manifest["evidence_window_index"] is None
    keys = list(manifest)
    assert keys.index("evidence_window_index") < keys.index("artifacts") < keys.index("run_label") == len(keys) - 1
    assert "evidence_window_index" not in candidate_manifest(
        "dpo", source_policy_version="s", policy_version="p", adapter_sha256="a"
    )


def test_unknown_kind_is_refused() -> None:
    """A kind the rules do not know is a programming error here, not a manifest to write."""
    with pytest.raises(ValueError, match="'sft'"):
        candidate_manifest("sft", source_policy_version="s", policy_version="p", adapter_sha256="a")


def test_writers_are_deterministic(tmp_path: Path) -> None:
    """Same inputs, same bytes: the adapter folder's hash and the manifest text repeat."""
    one = write_adapter(tmp_path / "a", "x", b"w")
    two = write_adapter(tmp_path / "b", "x", b"w")
    assert hash_directory(one) == hash_directory(two)
    doc = baseline_manifest("ab" * 32, run_label="v2")
    first, second = (write_manifest(tmp_path / name, doc) for name in ("m1.json", "m2.json"))
    assert first.read_bytes() == second.read_bytes()
    assert json.loads((tmp_path / "m1.json").read_text())["semantic_id"] == "PT-SFT-DELIVERY"
