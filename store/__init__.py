"""The event store: append, read and chain opaque event records; keep checkpoints.

It knows nothing of candidates or states. `lifecycle_fsm` gives it records and reads
them back; `replay` folds what it reads.

The public names load on first use (PEP 562 `__getattr__`): importing `store.errors`
(every CLI start does) does not pay for the SQLite store, the memory store and their attrs classes.
"""

from __future__ import annotations

import sys
import typing

if typing.TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` below loads these
    from lifecycle_fsm.store.base import AppendResult, EventStore, StoreTransaction
    from lifecycle_fsm.store.chain import GENESIS_HASH, canonical_json, event_hash
    from lifecycle_fsm.store.errors import (
        ConcurrencyError,
        ConflictError,
        DuplicateEventError,
        InputError,
        IntegrityError,
        LifecycleError,
        NotFoundError,
        StoreError,
    )
    from lifecycle_fsm.store.memory import MemoryEventStore
    from lifecycle_fsm.store.records import (
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

# public name -> the submodule that defines it (keep in step with the TYPE_CHECKING block)
_WHERE = {
    "AppendResult": "base",
    "EventStore": "base",
    "StoreTransaction": "base",
    "GENESIS_HASH": "chain",
    "canonical_json": "chain",
    "event_hash": "chain",
    "ConcurrencyError": "errors",
    "ConflictError": "errors",
    "DuplicateEventError": "errors",
    "InputError": "errors",
    "IntegrityError": "errors",
    "LifecycleError": "errors",
    "NotFoundError": "errors",
    "StoreError": "errors",
    "MemoryEventStore": "memory",
    "ChainReport": "records",
    "CheckpointRecord": "records",
    "EventFilter": "records",
    "Head": "records",
    "NewEvent": "records",
    "PayloadMatch": "records",
    "StoredEvent": "records",
    "StreamHead": "records",
    "StreamSnapshot": "records",
    "SQLiteEventStore": "sqlite",
}

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


def __getattr__(name: str) -> typing.Any:
    """Load a public name from its submodule on first use, then keep it as a plain attribute."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = f"{__name__}.{where}"
    __import__(module)  # the import statement's path (not importlib's), so `-X importtime` sees it
    value = getattr(sys.modules[module], name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
