"""Seed-shaped manifests and small adapter folders: the one factory for tests, drills and examples.

SPEC §7 (seed 000, Step 5) fixes the shapes: an SFT manifest whose adapter sha256 is
the active policy version, and DPO / GRPO / RLVR candidate manifests that name it as
`source_policy_version`. The test suite (`tests/conftest.py`), the drills
(`replay.drills.workspace`) and `examples/make_fixtures.py` all build their manifests
here, so a change to the shape is made once. Reading manifests back is
`lifecycle_fsm.manifests`; this module only writes what that one reads.

The builders return plain dicts (keyword fields replace or add keys, in place), so a
caller can still break a manifest on purpose: drop a key, set it to null, claim a
wrong sha256.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lifecycle_fsm.rules import CANDIDATE_KINDS

__all__ = [
    "baseline_manifest",
    "candidate_manifest",
    "write_adapter",
    "write_manifest",
]

JSON = dict[str, Any]

# What tells a candidate's kind and its branch evidence apart (seed 84 for DPO, 85 for
# GRPO/RLVR): the semantic id, then the evidence the freshness check reads.
_KIND_FIELDS: dict[str, JSON] = {
    "dpo": {"semantic_id": "PT-DPO-OFFLINE"},
    "grpo": {"semantic_id": "PT-GRPO-GROUPWISE"},
    "rlvr": {"semantic_id": "PT-GRPO-GROUPWISE", "candidate_kind": "rlvr"},
}


def baseline_manifest(adapter_sha256: str, *, adapter_path: str = "adapter", **fields: Any) -> JSON:
    """An SFT delivery manifest (seed 62): its adapter's sha256 becomes the active policy version."""
    adapter = {"path": adapter_path, "sha256": adapter_sha256}
    return {"semantic_id": "PT-SFT-DELIVERY", "artifacts": {"adapter": adapter}} | fields


def candidate_manifest(
    kind: str,
    *,
    source_policy_version: str | None,
    policy_version: str,
    adapter_sha256: str,
    adapter_path: str = "adapter",
    evaluation_version: str = "eval-v1",
    decision: str = "accept",
    **fields: Any,
) -> JSON:
    """A candidate manifest of `kind` (dpo, grpo, rlvr) branched from `source_policy_version`.

    DPO carries `source_evidence` (its preference evidence version); GRPO and RLVR carry
    `trajectory_identity.verifier_version` and `evidence_window_index` (1). `fields`
    replace any of these in place or add others (`run_label`, `metrics`, ...).
    """
    if kind not in _KIND_FIELDS:
        raise ValueError(f"unknown candidate kind {kind!r} (expected one of {', '.join(CANDIDATE_KINDS)})")
    manifest: JSON = {
        **_KIND_FIELDS[kind],
        "source_policy_version": source_policy_version,
        "policy_version": policy_version,
        "evaluation_version": evaluation_version,
    }
    if kind == "dpo":
        manifest["source_evidence"] = {"version": "pref-train-v1"}
    else:
        manifest["trajectory_identity"] = {"verifier_version": "math-v1"}
        manifest["evidence_window_index"] = 1  # the window the evidence came from (`fields` may say another)
    manifest["decision"] = decision
    manifest["artifacts"] = {"adapter": {"path": adapter_path, "sha256": adapter_sha256}}
    return manifest | fields


def write_adapter(folder: str | os.PathLike[str], name: str, weights: bytes) -> Path:
    """A small LoRA adapter folder as PEFT saves one: adapter_config.json and the weights file."""
    home = Path(folder)
    home.mkdir(parents=True, exist_ok=True)
    (home / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "name": name}))
    (home / "adapter_model.safetensors").write_bytes(weights)
    return home


def write_manifest(path: str | os.PathLike[str], manifest: JSON) -> Path:
    """Write a manifest as JSON (indented, keys in the order built), creating its folder."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest, indent=2))
    return target
