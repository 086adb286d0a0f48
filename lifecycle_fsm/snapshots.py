"""Whether a saved snapshot of folded state may be used: its fingerprint and its trust.

The fingerprint records what the folded state structurally depends on (the machine's table, the event
schemas, the state's fields and `_FOLD_VERSION`: bump it when a handler's meaning changes); a mismatch
makes the snapshot stale. It also records the rules' version, not as a structural part: rules alter
future decisions, never folded state, so a snapshot built under other rules is used, with a warning.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from lifecycle_fsm.candidate_events import EVENT_TYPES
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.machine import TABLE_DIGEST
from lifecycle_fsm.rules import RULES
from lifecycle_fsm.state import CandidateState, LedgerSettings
from lifecycle_fsm.store.base import EventStore, hash_at
from lifecycle_fsm.store.chain import canonical_json, snapshot_digest
from lifecycle_fsm.store.records import CheckpointRecord, StreamSnapshot

CHECKPOINT_SCHEMA_VERSION = 2  # 2: the snapshot holds the versions of streams that fold to no state
_FOLD_VERSION = 1

FINGERPRINT_PARTS: JSON = {
    "table": TABLE_DIGEST,
    "events": {name: cls.SCHEMA_VERSION for name, cls in sorted(EVENT_TYPES.items())},
    "fold": {
        "version": _FOLD_VERSION,
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
    saved = _saved_parts(fingerprint)
    if saved is None:
        return "unreadable fingerprint"
    parts = (saved.keys() - {"rules"}) | FINGERPRINT_PARTS.keys()
    return ", ".join(sorted(k for k in parts if saved.get(k) != FINGERPRINT_PARTS.get(k))) or None


def other_rules(fingerprint: str) -> Any:
    """The rules a usable snapshot was built under when they are not today's (None when it names none)."""
    saved = _saved_parts(fingerprint)
    rules = None if saved is None else saved.get("rules")
    return rules if rules is not None and rules != RULES else None


def snapshot_problem(
    store: EventStore, taken: CheckpointRecord | StreamSnapshot, text: str, sha256: str
) -> SnapshotProblem | None:
    """Why a snapshot (`text`, stored with `sha256`) taken at `taken.position` cannot be trusted, or None
    when it can: a checkpoint's whole snapshot, or one stream's copy of its state."""
    position = taken.position
    if taken.schema_version != CHECKPOINT_SCHEMA_VERSION:
        return SnapshotProblem(f"schema version {taken.schema_version} is not {CHECKPOINT_SCHEMA_VERSION}", stale=True)
    if taken.fingerprint != FINGERPRINT and (changed := _structural_problem(taken.fingerprint)):
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
