"""Whole-ledger state from the store: replay, checkpoints, verify; the auditor's views are its modules."""

from __future__ import annotations

from lifecycle_fsm.replay.checkpoints import (
    CHECKPOINT_SCHEMA_VERSION,
    FINGERPRINT,
    LedgerState,
    LoadResult,
    fold_rows,
    index_of,
    load_state,
    snapshot_json,
    take_checkpoint,
)
from lifecycle_fsm.replay.verify import verify

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "FINGERPRINT",
    "LedgerState",
    "LoadResult",
    "fold_rows",
    "index_of",
    "load_state",
    "snapshot_json",
    "take_checkpoint",
    "verify",
]
