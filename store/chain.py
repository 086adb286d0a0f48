"""Canonical encoding and the sha256 hash chain over the log.

Each event's hash is sha256 over a byte string that anyone can rebuild from the
stored columns without parsing the payload:

    prev_hash "\\n" header "\\n" payload

`header` is the canonical JSON (sorted keys, no spaces, UTF-8) of
`{"actor", "event_id", "recorded_at", "schema_version", "seq", "stream_id", "type",
"version"}` and `payload` is the payload's stored canonical JSON text. The first
event's `prev_hash` is `GENESIS_HASH` (64 zeros). Editing any column of any row
breaks that row's hash; removing or reordering rows breaks the next row's link.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import orjson

from store.errors import InputError
from store.records import StoredEvent

GENESIS_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON; refuses non-finite floats, which orjson would write as null."""
    try:
        out = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError as e:
        raise InputError(f"payload is not JSON-serialisable: {e}") from e
    if b"null" in out:  # orjson writes NaN and infinities as null: only then look for them
        _refuse_non_finite(value)
    return out.decode()


def _refuse_non_finite(value: Any) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"payload holds a non-finite number ({value}); JSON cannot carry it")
    elif isinstance(value, dict):
        for item in value.values():
            _refuse_non_finite(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _refuse_non_finite(item)


def event_hash(
    *,
    prev_hash: str,
    seq: int,
    stream_id: str,
    version: int,
    event_id: str,
    type: str,
    schema_version: int,
    payload: str,
    recorded_at: str,
    actor: str,
) -> str:
    """The chain hash of one event (see the module docstring for the exact bytes)."""
    header = orjson.dumps(
        {
            "actor": actor,
            "event_id": event_id,
            "recorded_at": recorded_at,
            "schema_version": schema_version,
            "seq": seq,
            "stream_id": stream_id,
            "type": type,
            "version": version,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    digest = hashlib.sha256(prev_hash.encode())
    digest.update(b"\n")
    digest.update(header)
    digest.update(b"\n")
    digest.update(payload.encode())
    return digest.hexdigest()


def rehash(event: StoredEvent, prev_hash: str) -> str:
    """Recompute a stored event's hash given the hash that should precede it."""
    return event_hash(
        prev_hash=prev_hash,
        seq=event.seq,
        stream_id=event.stream_id,
        version=event.version,
        event_id=event.event_id,
        type=event.type,
        schema_version=event.schema_version,
        payload=event.payload,
        recorded_at=event.recorded_at,
        actor=event.actor,
    )
