"""The one-round-trip append, chained by the server: seq and hash computed under the lock.

Why it is built this way:
- The client cannot know the head it chains to without asking under the lock: a
  guessed head goes stale whenever another writer appended since, and a stale guess
  cost a refused trip and then a head read holding the lock across a network round trip
  and this process's hashing. With 8 writers nearly every guess was stale, so the lock
  was held across client work on a CPU-starved machine. Instead the INSERT reads the
  head itself (the statement runs after the lock, in read committed: it sees the newest
  committed head) and computes `seq` and the sha256 chain hash (`store.chain`'s exact
  bytes) in SQL: the lock is held only while the server runs one message.
- The client sends each event's canonical header split around `seq` (the only header
  field it cannot know), so every escape is still orjson's; the server concatenates
  `prev_hash \\n prefix seq suffix \\n payload`, hashes its UTF-8 bytes and returns
  `seq, prev_hash, hash`. The client re-hashes every returned row with
  `store.chain.chain_hash` (a few µs): an event hashes the same as in SQLite, or the
  append is reported as an IntegrityError.
- Rows are chained by a recursive CTE over arrays (one statement shape whatever the
  batch size, so one PREPAREd plan). No server-side function: an existing ledger opens
  without DDL, by a role that may only SELECT and INSERT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from store.chain import GENESIS_HASH, chain_hash
from store.errors import IntegrityError
from store.records import NewEvent, StoredEvent

__all__ = ["chained_insert_sql", "check_server_chain", "header_parts"]

_VERSION_IS = "coalesce((SELECT max(version) FROM events WHERE stream_id = %s), 0) = %s"
_NEWLINE = "E'\\n'"
# Then the stream index, only if the insert happened (in the same statement), and the rows.
_INDEX_AND_RESULT = """up AS (
  INSERT INTO streams (stream_id, version, status, category) SELECT %s, %s::bigint, %s, %s
  WHERE EXISTS (SELECT FROM ins)
  ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version,
  status = coalesce(excluded.status, streams.status), category = coalesce(excluded.category, streams.category))
SELECT seq, prev_hash, hash FROM ins ORDER BY seq"""
_CHAINED_INSERT = f"""WITH RECURSIVE a AS MATERIALIZED (
  SELECT %s::text[] AS event_id, %s::text[] AS type, %s::integer[] AS schema_version, %s::text[] AS payload,
         %s::text[] AS recorded_at, %s::text[] AS actor, %s::text[] AS pre, %s::text[] AS post),
c (n, seq, prev, hash) AS (
  SELECT 0, coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), 0), ''::text,
         coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), '{GENESIS_HASH}')
  UNION ALL
  SELECT c.n + 1, c.seq + 1, c.hash, encode(sha256(convert_to(c.hash || {_NEWLINE} || a.pre[c.n + 1]
         || (c.seq + 1)::text || a.post[c.n + 1] || {_NEWLINE} || a.payload[c.n + 1], 'UTF8')), 'hex')
  FROM c, a WHERE c.n < cardinality(a.pre)),
ins AS (
  INSERT INTO events (seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor,
                      prev_hash, hash)
  SELECT c.seq, %s, %s::bigint + c.n, a.event_id[c.n], a.type[c.n], a.schema_version[c.n], a.payload[c.n],
         a.recorded_at[c.n], a.actor[c.n], c.prev, c.hash
  FROM c, a WHERE c.n > 0{{guards}}
  RETURNING seq, prev_hash, hash),
{_INDEX_AND_RESULT}"""

# One event (what a command appends): no recursion and no arrays, the cheaper plan and binding.
_CHAINED_INSERT_ONE = f"""WITH h AS MATERIALIZED (
  SELECT coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), 0) + 1 AS seq,
         coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), '{GENESIS_HASH}') AS prev),
ins AS (
  INSERT INTO events (seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor,
                      prev_hash, hash)
  SELECT h.seq, v.stream_id, v.version, v.event_id, v.type, v.schema_version, v.payload, v.recorded_at, v.actor, h.prev,
         encode(sha256(convert_to(h.prev || {_NEWLINE} || v.pre || h.seq::text || v.post || {_NEWLINE} || v.payload,
                                  'UTF8')), 'hex')
  FROM h, (VALUES (%s, %s::bigint, %s, %s, %s::integer, %s, %s, %s, %s, %s))
       AS v (stream_id, version, event_id, type, schema_version, payload, recorded_at, actor, pre, post)
  WHERE true{{guards}}
  RETURNING seq, prev_hash, hash),
{_INDEX_AND_RESULT}"""


def header_parts(new: NewEvent, stream_id: str, version: int) -> tuple[str, str]:
    """The canonical header (see `store.chain`) before and after the `seq` value.

    Keys sort as actor, event_id, recorded_at, schema_version | seq | stream_id, type,
    version, so the two halves are two compact orjson objects with their brace cut off.
    """
    before = orjson.dumps(
        {"actor": new.actor, "event_id": new.event_id, "recorded_at": new.recorded_at,
         "schema_version": new.schema_version}
    )  # fmt: skip
    after = orjson.dumps({"stream_id": stream_id, "type": new.type, "version": version})
    return before[:-1].decode() + ',"seq":', "," + after[1:].decode()


def chained_insert_sql(
    stream_id: str,
    expected_version: int,
    events: Sequence[NewEvent],
    payloads: Sequence[str],
    checks: Sequence[tuple[str, int]],
    ids: list[str] | None,
    index: tuple[str | None, str | None],
) -> tuple[str, list[Any]]:
    """The one statement that appends `events` after whatever head it finds, only if every
    `(stream, version)` of `checks` holds and (with `ids`) none of the event ids is taken,
    and upserts the stream index; it returns `(seq, prev_hash, hash)` per row, none if refused."""
    parts = [header_parts(e, stream_id, expected_version + n) for n, e in enumerate(events, start=1)]
    guards = f" AND {_VERSION_IS}" * len(checks)
    if len(events) == 1:
        template = _CHAINED_INSERT_ONE
        e, (pre, post) = events[0], parts[0]
        params: list[Any] = [stream_id, expected_version + 1, e.event_id, e.type, e.schema_version, payloads[0],
                             e.recorded_at, e.actor, pre, post]  # fmt: skip
    else:
        template = _CHAINED_INSERT
        params = [
            [e.event_id for e in events], [e.type for e in events], [e.schema_version for e in events],
            list(payloads), [e.recorded_at for e in events], [e.actor for e in events], [p[0] for p in parts],
            [p[1] for p in parts], stream_id, expected_version,
        ]  # fmt: skip
    params += [v for pair in checks for v in pair]
    if ids is not None:
        guards += " AND NOT EXISTS (SELECT FROM events WHERE event_id = ANY(%s::text[]))"
        params.append(ids)
    params += [stream_id, expected_version + len(events), *index]
    return template.format(guards=guards), params


def check_server_chain(
    returned: Sequence[tuple[Any, ...]],
    stream_id: str,
    expected_version: int,
    events: Sequence[NewEvent],
    payloads: Sequence[str],
) -> tuple[StoredEvent, ...]:
    """The stored events, once every returned hash is the one `store.chain` computes (and links)."""
    stored: list[StoredEvent] = []
    prev = returned[0][1]
    for n, ((seq, prev_hash, digest), new, payload) in enumerate(zip(returned, events, payloads, strict=True), 1):
        version = expected_version + n
        mine = chain_hash(prev, seq, stream_id, version, new.event_id, new.type, new.schema_version,
                          payload, new.recorded_at, new.actor)  # fmt: skip
        if prev_hash != prev or digest != mine or (n > 1 and seq != stored[-1].seq + 1):
            raise IntegrityError(
                f"the server chained seq {seq} to hash {digest} but this client computes {mine}: "
                "the ledger's chain does not verify from there (report this, with the server's encoding)",
                seq=seq,
            )
        stored.append(StoredEvent(seq, stream_id, version, new.event_id, new.type, new.schema_version,
                                  payload, new.recorded_at, new.actor, prev_hash, digest))  # fmt: skip
        prev = digest
    return tuple(stored)
