"""A drill's temporary folder: the artifacts its scenario declares, and its ledger file.

Adapters are written with the one manifest factory (`lifecycle_fsm.fixtures`) in the
seed's shapes, hashed exactly as `lifecycle hash` hashes them; trusted states are
folders of seeded random bytes. Every byte depends only on the seed and the
artifact's name, so two runs of a scenario build identical workspaces.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.fixtures import baseline_manifest, candidate_manifest, write_adapter, write_manifest
from replay.drills.schema import ArtifactSpec, DrillConfig

__all__ = ["Workspace"]

JSON = dict[str, Any]


@attrs.define
class Workspace:
    """The folder a scenario runs in: its artifacts by name and the ledger file beside them."""

    root: Path
    seed: int
    folders: dict[str, Path] = attrs.Factory(dict)  # artifact -> adapter or trusted-state folder
    manifests: dict[str, Path] = attrs.Factory(dict)

    @property
    def db(self) -> Path:
        return self.root / "ledger.db"

    def shown(self, value: Any) -> Any:
        """Hide the temporary folder so reports compare equal across runs."""
        if isinstance(value, str):
            for prefix in {str(self.root.resolve()), str(self.root)}:
                value = value.replace(prefix, "<workspace>")
        elif isinstance(value, list):
            value = [self.shown(v) for v in value]
        elif isinstance(value, dict):
            value = {k: self.shown(v) for k, v in value.items()}
        return value

    def materialize(self, artifacts: Mapping[str, ArtifactSpec], config: DrillConfig) -> None:
        """Write every declared artifact, baselines first (candidates name their sha256)."""
        shas: dict[str, str] = {}
        for spec in sorted(artifacts.values(), key=lambda s: s.type != "baseline"):
            self._write(spec, config, shas)

    def _write(self, spec: ArtifactSpec, config: DrillConfig, shas: dict[str, str]) -> None:
        home = self.root / "artifacts" / spec.name
        rng = random.Random(f"{self.seed}:{spec.name}")  # each artifact's bytes depend only on the seed and its name
        if spec.type == "trusted_state":
            home.mkdir(parents=True)
            (home / "state.bin").write_bytes(rng.randbytes(spec.size))
            self.folders[spec.name] = home
            return
        sha = hash_directory(write_adapter(home / "adapter", spec.name, rng.randbytes(spec.size)))
        overrides = dict(spec.manifest)
        claimed = overrides.pop("adapter_sha256", sha)
        manifest: JSON
        if spec.type == "baseline":
            shas[spec.name] = sha
            manifest = baseline_manifest(claimed) | overrides
        else:
            baseline = spec.source or next(iter(shas), None)
            fields: JSON = {
                "source_policy_version": shas.get(baseline) if baseline else None,
                "policy_version": spec.name,
                "evaluation_version": config.evaluation_version or "eval-v1",
            }
            if spec.type != "dpo":
                fields["evidence_window_index"] = config.active_window
            manifest = candidate_manifest(spec.type, adapter_sha256=claimed, **(fields | overrides))
        for key in spec.drop:
            if key == "adapter_sha256":
                manifest["artifacts"]["adapter"].pop("sha256")
            else:
                manifest.pop(key, None)
        self.folders[spec.name] = home / "adapter"
        self.manifests[spec.name] = write_manifest(home / "manifest.json", manifest)

    def keep(self, keep_dir: Path, name: str) -> str:
        """Copy the ledger (a consistent copy via SQLite's backup API) to keep_dir/<name>.db."""
        keep_dir.mkdir(parents=True, exist_ok=True)
        target = keep_dir / f"{name}.db"
        target.unlink(missing_ok=True)
        with closing(sqlite3.connect(self.db)) as src, closing(sqlite3.connect(target)) as dst:
            src.backup(dst)
        return target.name
