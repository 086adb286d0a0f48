"""Rebuilding whole-ledger state from the store: replay, checkpoints, explain, verify."""

from __future__ import annotations

from lifecycle_fsm.replay.checkpoints import (
    CHECKPOINT_SCHEMA_VERSION,
    FINGERPRINT,
    LoadResult,
    load_state,
    take_checkpoint,
)
from lifecycle_fsm.replay.explain import explain
from lifecycle_fsm.replay.fold import LedgerState, fold_rows, index_of, snapshot_json
from lifecycle_fsm.replay.verify import verify

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
