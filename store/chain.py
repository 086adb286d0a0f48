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
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise InputError(f"payload holds a non-finite number ({item}); JSON cannot carry it")


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
    return chain_hash(prev_hash, seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor)


def chain_hash(
    prev_hash: str,
    seq: int,
    stream_id: str,
    version: int,
    event_id: str,
    type_name: str,
    schema_version: int,
    payload: str,
    recorded_at: str,
    actor: str,
) -> str:
    """`event_hash` with positional arguments, for the append and verify hot paths."""
    header = orjson.dumps(
        {
            "actor": actor,
            "event_id": event_id,
            "recorded_at": recorded_at,
            "schema_version": schema_version,
            "seq": seq,
            "stream_id": stream_id,
            "type": type_name,
            "version": version,
        }
    )  # keys are written in sorted order already: no sort option needed
    return hashlib.sha256(b"%s\n%s\n%s" % (prev_hash.encode(), header, payload.encode())).hexdigest()


def rehash(event: StoredEvent, prev_hash: str) -> str:
    """Recompute a stored event's hash given the hash that should precede it."""
    return chain_hash(
        prev_hash, event.seq, event.stream_id, event.version, event.event_id, event.type,
        event.schema_version, event.payload, event.recorded_at, event.actor,
    )  # fmt: skip
