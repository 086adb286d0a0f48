"""The event store: append, read and chain opaque event records; keep checkpoints.

It knows nothing of candidates or states. `lifecycle_fsm` gives it records and reads
them back; `replay` folds what it reads.
"""

from __future__ import annotations

from store.base import AppendResult, EventStore, StoreTransaction
from store.chain import GENESIS_HASH, canonical_json, event_hash
from store.errors import (
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    InputError,
    IntegrityError,
    LifecycleError,
    NotFoundError,
    StoreError,
)
from store.memory import MemoryEventStore
from store.records import (
    ChainReport,
    CheckpointRecord,
    EventFilter,
    Head,
    NewEvent,
    PayloadMatch,
    StoredEvent,
    StreamHead,
    StreamSnapshot,
)
from store.sqlite import SQLiteEventStore

__all__ = [
    "AppendResult",
    "ChainReport",
    "CheckpointRecord",
    "ConcurrencyError",
    "ConflictError",
    "DuplicateEventError",
    "EventFilter",
    "EventStore",
    "GENESIS_HASH",
    "Head",
    "InputError",
    "IntegrityError",
    "LifecycleError",
    "MemoryEventStore",
    "NewEvent",
    "NotFoundError",
    "PayloadMatch",
    "SQLiteEventStore",
    "StoreError",
    "StoreTransaction",
    "StoredEvent",
    "StreamHead",
    "StreamSnapshot",
    "canonical_json",
    "event_hash",
]
