"""The event store: an append-only, hash-chained log of opaque events, with checkpoints.

It knows nothing of the domain; its errors are `lifecycle_fsm.errors`' own, re-exported here."""

from __future__ import annotations

from lifecycle_fsm.errors import (
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    InputError,
    IntegrityError,
    LifecycleError,
    NotFoundError,
    StoreError,
)
from lifecycle_fsm.store.base import EventStore, StoreTransaction, event_at, hash_at, select_events, verify_chain
from lifecycle_fsm.store.chain import GENESIS_HASH, ChainWalk, canonical_json, event_hash
from lifecycle_fsm.store.memory import MemoryEventStore
from lifecycle_fsm.store.records import (
    AppendResult,
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
from lifecycle_fsm.store.sqlite import SQLiteEventStore

__all__ = [
    "AppendResult",
    "ChainReport",
    "ChainWalk",
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
    "event_at",
    "event_hash",
    "hash_at",
    "select_events",
    "verify_chain",
]
