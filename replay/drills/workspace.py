"""A drill's temporary folder: its scenario's artifacts (every byte from the seed and the artifact's name, so
two runs build identical workspaces) and its ledger file. The adapters and manifests it is seeded with are plain
dicts with a drill's defaults (the tests and examples use them too), so a caller can still break one on purpose."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm import manifests
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.folders import make_folder
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.manifests import write_manifest
from lifecycle_fsm.replay.drills.schema import ArtifactSpec, DrillConfig
from lifecycle_fsm.store.sqlite_files import create_ledger_file


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


@attrs.define
class Workspace:
    """The folder a scenario runs in: its artifacts by name and the ledger file beside them."""

    root: Path
    seed: int
    folders: dict[str, Path] = attrs.Factory(dict)  # artifact -> adapter or trusted-state folder
    manifests: dict[str, Path] = attrs.Factory(dict)
    specs: dict[str, ArtifactSpec] = attrs.Factory(dict)
    shas: dict[str, str] = attrs.Factory(dict)  # baseline -> its adapter's real sha256
    written: dict[str, str] = attrs.Factory(dict)  # adapter -> the sha256 it was written with
    config: DrillConfig = attrs.Factory(DrillConfig)
    tampered: dict[str, set[str]] = attrs.Factory(dict)  # artifact -> sha256 of every state its tampered file had

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
        self.config = config
        for name, spec in sorted(artifacts.items(), key=lambda item: item[1].type != "baseline"):
            self._write(name, spec)

    def _write(self, name: str, spec: ArtifactSpec) -> None:
        home = self.root / "artifacts" / name
        rng = random.Random(f"{self.seed}:{name}")
        self.specs[name] = spec
        if spec.type == "trusted_state":
            home.mkdir(parents=True)
            (home / "state.bin").write_bytes(rng.randbytes(spec.size))
            self.folders[name] = home
            return
        sha = hash_directory(write_adapter(home / "adapter", name, rng.randbytes(spec.size)))
        if spec.type == "baseline":
            self.shas[name] = sha
        self.written[name] = sha
        self.folders[name] = home / "adapter"
        self.manifests[name] = home / "manifest.json"
        self._render(name, spec, sha)

    def _render(self, name: str, spec: ArtifactSpec, sha: str) -> None:
        """Write (or rewrite, in place) an adapter's manifest from its spec."""
        overrides = dict(spec.manifest)
        claimed = overrides.pop("adapter_sha256", sha)
        manifest: JSON
        if spec.type == "baseline":
            manifest = baseline_manifest(claimed) | overrides
        else:
            baseline = spec.source or next(iter(self.shas), None)
            fields: JSON = {
                "source_policy_version": self.shas.get(baseline) if baseline else None,
                "policy_version": name,
            }
            fields["evaluation_version"] = self.config.evaluation_version or "eval-v1"
            if spec.type != "dpo":
                fields["evidence_window_index"] = self.config.active_window
            manifest = candidate_manifest(spec.type, adapter_sha256=claimed, **(fields | overrides))
        for key in spec.drop:
            if key == "adapter_sha256":
                manifest["artifacts"]["adapter"].pop("sha256")
            else:
                manifest.pop(key, None)
        write_manifest(self.manifests[name], manifest)

    def edit_manifest(self, name: str, changes: Mapping[Any, Any], drop: tuple[str, ...]) -> None:
        """Rewrite a manifest in place: the spec's overrides plus `changes` (no longer dropped), minus `drop`."""
        spec = self.specs[name]
        manifest: dict[Any, Any] = {k: v for k, v in (dict(spec.manifest) | dict(changes)).items() if k not in drop}
        dropped: tuple[Any, ...] = tuple(dict.fromkeys([*(k for k in spec.drop if k not in changes), *drop]))
        self.specs[name] = spec = attrs.evolve(spec, manifest=manifest, drop=dropped)
        self._render(name, spec, self.written[name])

    def backup(self, name: str) -> None:
        """Keep an artifact's original bytes (once) before a fault damages it, so it can be restored."""
        saved = self.root / "originals" / name
        if not saved.exists():
            shutil.copytree(self.folders[name], saved)

    def restore(self, name: str) -> bool:
        """Put the original bytes back; False when nothing was saved (it was never damaged)."""
        saved = self.root / "originals" / name
        if not saved.exists():
            return False
        shutil.rmtree(self.folders[name], ignore_errors=True)
        shutil.copytree(saved, self.folders[name])
        return True

    def keep(self, keep_dir: Path, name: str) -> str:
        """Copy the ledger (SQLite's backup API) to a new 0600 keep_dir/<name>.db, never over one."""
        target = make_folder(keep_dir, "--keep folder") / f"{name}.db"
        try:
            create_ledger_file(target, exclusive=True)
        except FileExistsError:
            raise _kept_exists(target) from None
        with closing(sqlite3.connect(self.db)) as src, closing(sqlite3.connect(target)) as dst:
            src.backup(dst)
        return target.name


def _kept_exists(path: Path) -> InputError:
    return InputError(f"{path} exists: --keep never overwrites a kept ledger (move it away, or --keep another folder)")


def refuse_kept(keep_dir: Path | None, names: Iterable[str]) -> None:
    """Before a drill runs: refuse (exit 3) when a ledger it would keep (DIR/<name>.db) is already there."""
    if keep_dir is None:
        return
    for path in (keep_dir / f"{name}.db" for name in names):
        if os.path.lexists(path):
            raise _kept_exists(path)
