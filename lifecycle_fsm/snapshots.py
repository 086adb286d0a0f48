"""Whether a saved snapshot of folded state may be used: its fingerprint and its trust.

A checkpoint (and each per-stream copy inside it) records what the folded state it
holds structurally depends on, as a training resume checkpoint records its config fingerprint:
- the machine's table (`machine.TABLE_DIGEST`),
- every event type with its schema version,
- the fields of the folded state and a declared `FOLD_VERSION` (bump it when the
  meaning of a handler changes without a table or schema change).
A mismatch means the snapshot was built by other code: it is *stale*, not used, and
the reason names the part that differs. The fingerprint also records the decision rules'
version (`rules.RULES`), but not as a structural part: a rules change alters future
decisions, never the state folded from recorded ones, so a snapshot built under other
rules is used, with a warning (`other_rules`).

`snapshot_problem` is the one place that decides whether a snapshot can be
trusted; commands, replay and `verify` all ask it.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from lifecycle_fsm.events import EVENT_TYPES
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.machine import TABLE_DIGEST
from lifecycle_fsm.rules import RULES
from lifecycle_fsm.state import CandidateState, LedgerSettings
from lifecycle_fsm.store.base import EventStore, hash_at
from lifecycle_fsm.store.chain import canonical_json, snapshot_digest
from lifecycle_fsm.store.records import CheckpointRecord, StreamSnapshot

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "FINGERPRINT",
    "FINGERPRINT_PARTS",
    "FOLD_VERSION",
    "SnapshotProblem",
    "other_rules",
    "snapshot_problem",
]

CHECKPOINT_SCHEMA_VERSION = 2  # 2: the snapshot holds the versions of streams that fold to no state
FOLD_VERSION = 1

FINGERPRINT_PARTS: JSON = {
    "table": TABLE_DIGEST,
    "events": {name: cls.SCHEMA_VERSION for name, cls in sorted(EVENT_TYPES.items())},
    "fold": {
        "version": FOLD_VERSION,
        "candidate_fields": [a.name for a in attrs.fields(CandidateState)],
        "settings_fields": [a.name for a in attrs.fields(LedgerSettings)],
    },
}
FINGERPRINT = canonical_json({**FINGERPRINT_PARTS, "rules": RULES})


@attrs.frozen
class SnapshotProblem:
    """Why a snapshot is not used; `stale` when other code built it (not a corruption)."""

    reason: str
    stale: bool


def _saved_parts(fingerprint: str) -> JSON | None:
    try:
        saved = orjson.loads(fingerprint)
    except orjson.JSONDecodeError:
        return None
    return saved if isinstance(saved, dict) else None


def _structural_problem(fingerprint: str) -> str | None:
    """The structural parts that differ from this code's (the rules are not one), or None."""
    if fingerprint == FINGERPRINT:
        return None
    saved = _saved_parts(fingerprint)
    if saved is None:
        return "unreadable fingerprint"
    parts = (saved.keys() - {"rules"}) | FINGERPRINT_PARTS.keys()
    changed = sorted(k for k in parts if saved.get(k) != FINGERPRINT_PARTS.get(k))
    return ", ".join(changed) or None


def other_rules(fingerprint: str) -> Any:
    """The rules a usable snapshot was built under when they are not today's (else None).

    A snapshot written before rules were recorded names none: nothing to compare, no warning.
    """
    if fingerprint == FINGERPRINT:
        return None
    saved = _saved_parts(fingerprint)
    rules = None if saved is None else saved.get("rules")
    return rules if rules is not None and rules != RULES else None


def snapshot_problem(
    store: EventStore, taken: CheckpointRecord | StreamSnapshot, text: str, sha256: str
) -> SnapshotProblem | None:
    """Why a snapshot (`text`, stored with `sha256`) taken at `taken.position` cannot be trusted, or None
    when it can: a checkpoint's whole snapshot, or one stream's copy of its state."""
    schema_version, fingerprint, position = taken.schema_version, taken.fingerprint, taken.position
    if schema_version != CHECKPOINT_SCHEMA_VERSION:
        return SnapshotProblem(f"schema version {schema_version} is not {CHECKPOINT_SCHEMA_VERSION}", stale=True)
    if changed := _structural_problem(fingerprint):
        return SnapshotProblem(f"built by a different {changed} (fingerprint mismatch)", stale=True)
    if type(position) is not int or position < 0:  # text, NULL or a float past any seq, written by hand
        return SnapshotProblem(f"position {position!r} is not a seq (corrupt)", stale=False)
    if not isinstance(text, str) or not isinstance(sha256, str):  # NULL or a BLOB, written with the sqlite3 shell
        return SnapshotProblem("snapshot or its sha256 is not text (corrupt)", stale=False)
    if snapshot_digest(text) != sha256:
        return SnapshotProblem("snapshot does not match its sha256 (corrupt)", stale=False)
    actual = hash_at(store, position)
    if actual is None:
        return SnapshotProblem(f"position {position} is past the log's head", stale=False)
    if actual != taken.head_hash:
        return SnapshotProblem(f"head hash at position {position} does not match the log", stale=False)
    return None
