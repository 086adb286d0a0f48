"""The adapters and manifests a drill seeds its workspace with (the tests and examples use them too): plain
dicts with a drill's defaults, so a caller can still break a manifest on purpose."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lifecycle_fsm import manifests
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.manifests import write_manifest

__all__ = ["baseline_manifest", "candidate_manifest", "write_adapter", "write_manifest"]


def baseline_manifest(adapter_sha256: str, *, adapter_path: str = "adapter", **fields: Any) -> JSON:
    """An SFT manifest whose adapter's sha256 becomes the active policy version."""
    return manifests.baseline_manifest(adapter_path=adapter_path, adapter_sha256=adapter_sha256, **fields)


def candidate_manifest(
    kind: str,
    *,
    source_policy_version: Any,
    policy_version: str,
    adapter_sha256: str,
    adapter_path: str = "adapter",
    evaluation_version: str = "eval-v1",
    decision: str = "accept",
    **fields: Any,
) -> JSON:
    """A candidate manifest of `kind` (dpo, grpo, rlvr) branched from `source_policy_version`."""
    return (
        manifests.candidate_manifest(
            candidate_id=policy_version,
            kind=kind,
            source_policy_version=source_policy_version,
            adapter_path=adapter_path,
            adapter_sha256=adapter_sha256,
            evaluation_version=evaluation_version,
            decision=decision,
            source_evidence_version="pref-train-v1" if kind == "dpo" else None,
            verifier_version=None if kind == "dpo" else "math-v1",
            evidence_window_index=None if kind == "dpo" else 1,
        )
        | fields
    )  # after the builder's checks: a caller may break a field on purpose


def write_adapter(folder: str | os.PathLike[str], name: str, weights: bytes) -> Path:
    """A small LoRA adapter folder as PEFT saves one: adapter_config.json and the weights file."""
    home = Path(folder)
    home.mkdir(parents=True, exist_ok=True)
    (home / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "name": name}))
    (home / "adapter_model.safetensors").write_bytes(weights)
    return home
