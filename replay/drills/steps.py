"""The steps added for issue #15: a crash around any command, concurrent writers, restoring
an artifact, editing a manifest in place, an `audit`, and what `expect: {explain: …}` compares.

They are declared like the rest of the format (`schema.py`); the commands a `crash` or a
`concurrently` step runs are ordinary command steps, parsed by `loader.py` into `Step.inner`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from lifecycle_fsm.replay.drills.action import Action, between

__all__ = ["Audit", "Concurrently", "Crash", "EditManifest", "ExplainExpectation", "RestoreArtifact"]


@attrs.frozen(kw_only=True)
class Crash(Action):
    """Run one command in a child process that SIGKILLs itself at `at` on its `commit`-th commit."""

    name = "crash"
    at: Literal["before_commit", "after_commit"]
    commit: int = attrs.field(default=1, validator=between(1, 50, "must be between 1 and 50"))
    run: Any  # one command step (a mapping), e.g. {activate_baseline: sft-v2}


@attrs.frozen(kw_only=True)
class Concurrently(Action):
    """Several writers at once, each its own process (or thread) with its own `Ledger`."""

    name = "concurrently"
    writers: Any  # a list of command steps; each may carry `refused:`
    mode: Literal["processes", "threads"] = "processes"
    repeat: int = attrs.field(default=1, validator=between(1, 100, "must be between 1 and 100"))


@attrs.frozen(kw_only=True)
class RestoreArtifact(Action):
    """Put back the bytes an artifact had before it was tampered with or deleted."""

    name, shorthand = "restore_artifact", "artifact"
    artifact: str


@attrs.frozen(kw_only=True)
class EditManifest(Action):
    """Rewrite a declared artifact's manifest file in place (same path), changing or dropping fields."""

    name = "edit_manifest"
    artifact: str
    set: Mapping[str, Any] = attrs.Factory(dict)
    drop: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Audit(Action):
    """`lifecycle audit --mode real_artifact` through this ledger, records written in the workspace."""

    name = "audit"
    baseline: str
    candidates: tuple[str, ...]
    label: str = "drill"


@attrs.frozen(kw_only=True)
class ExplainExpectation:
    """What `expect: {explain: …}` compares with `lifecycle explain ID --json` (as of `as_of`, if given)."""

    seq: int | None = None  # the decisive event's seq
    type: str | None = None  # the decisive event's type
    reason_codes: list[str] | None = None
    evidence: Mapping[str, Any] | None = None  # dotted paths into the explain document -> value
