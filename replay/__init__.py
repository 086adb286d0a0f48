"""Rebuilding whole-ledger state from the store: replay, checkpoints, explain, verify."""

from __future__ import annotations

from replay.checkpoints import CHECKPOINT_SCHEMA_VERSION, FINGERPRINT, LoadResult, load_state, take_checkpoint
from replay.explain import explain
from replay.fold import LedgerState, fold_rows, index_of, snapshot_json
from replay.verify import verify

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "FINGERPRINT",
    "LedgerState",
    "LoadResult",
    "explain",
    "fold_rows",
    "index_of",
    "load_state",
    "snapshot_json",
    "take_checkpoint",
    "verify",
]
