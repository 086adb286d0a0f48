"""The one-round-trip append, chained by the server: seq and hash computed under the lock.

Why it is built this way:
- The client cannot know the head it chains to without asking under the lock: a
  guessed head goes stale whenever another writer appended since, and a stale guess
  cost a refused trip and then a head read holding the lock across a network round trip
  and this process's hashing. With 8 writers nearly every guess was stale, so the lock
  was held across client work on a CPU-starved machine. Instead the INSERT reads the
  head itself (the statement runs after the lock, in read committed: it sees the newest
  committed head) and computes `seq`, and the sha256 chain hash (`store.chain`'s exact
  bytes) in SQL when the head is not the one the client guessed. When it is (one writer,
  the common case) it stores the client's hashes: the server's sha256 measured about a
  quarter of the one-event insert's execution time (EXPLAIN ANALYZE, PostgreSQL 15).
- The client sends each event's canonical header split around `seq` (the only header
  field it cannot know), so every escape is still orjson's; the server concatenates
  `prev_hash \\n prefix seq suffix \\n payload`, hashes its UTF-8 bytes and returns
  `seq, prev_hash, hash`. The client re-hashes every row it did not chain itself with
  `store.chain.chain_hash` (a few µs): an event hashes the same as in SQLite, or the
  append is reported as an IntegrityError.
- Rows are chained by a recursive CTE over arrays (one statement shape whatever the
  batch size, so one PREPAREd plan). No server-side function: an existing ledger opens
  without DDL, by a role that may only SELECT and INSERT.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import orjson

from lifecycle_fsm.store.chain import GENESIS_HASH, chain_hash
from lifecycle_fsm.store.errors import IntegrityError
from lifecycle_fsm.store.records import Head, StoredEvent

__all__ = ["chained_insert_sql", "check_server_chain", "header_parts"]

_NEWLINE = "E'\\n'"
# Then the stream index, only if the insert happened (in the same statement), and the rows; a row
# returned also notifies followers (PostgreSQL delivers one per channel and transaction, at COMMIT).
_INDEX_AND_RESULT = """up AS (
  INSERT INTO streams (stream_id, version, status, category)
  SELECT ${stream}, ${version}::bigint, ${status}, ${category} WHERE EXISTS (SELECT FROM ins)
  ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version,
  status = coalesce(excluded.status, streams.status), category = coalesce(excluded.category, streams.category))
SELECT seq, prev_hash, hash, pg_notify(${channel}, NULL) FROM ins{order}"""
# Parameters $1..$13: the rows as arrays, the guessed head, the stream and its version before them.
_CHAINED_INSERT = f"""WITH RECURSIVE a AS MATERIALIZED (
  SELECT $1::text[] AS event_id, $2::text[] AS type, $3::integer[] AS schema_version, $4::text[] AS payload,
         $5::text[] AS recorded_at, $6::text[] AS actor, $7::text[] AS pre, $8::text[] AS post,
         $9::text[] AS hash, $10::bigint AS guess_seq, $11::text AS guess_hash),
head AS MATERIALIZED (
  SELECT coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), 0) AS seq,
         coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), '{GENESIS_HASH}') AS hash),
c (n, seq, prev, hash, guessed) AS (
  SELECT 0, head.seq, ''::text, head.hash, head.seq = a.guess_seq AND head.hash = a.guess_hash FROM head, a
  UNION ALL
  SELECT c.n + 1, c.seq + 1, c.hash, CASE WHEN c.guessed THEN a.hash[c.n + 1] ELSE
         encode(sha256(convert_to(c.hash || {_NEWLINE} || a.pre[c.n + 1] || (c.seq + 1)::text || a.post[c.n + 1]
         || {_NEWLINE} || a.payload[c.n + 1], 'UTF8')), 'hex') END, c.guessed
  FROM c, a WHERE c.n < cardinality(a.pre)),
ins AS (
  INSERT INTO events (seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor,
                      prev_hash, hash)
  SELECT c.seq, $12, $13::bigint + c.n, a.event_id[c.n], a.type[c.n], a.schema_version[c.n], a.payload[c.n],
         a.recorded_at[c.n], a.actor[c.n], c.prev, c.hash
  FROM c, a WHERE c.n > 0{{guards}}
  RETURNING seq, prev_hash, hash),
{_INDEX_AND_RESULT}"""

# One event (what a command appends): no recursion, no arrays, no VALUES list; the head row and
# every checked stream's version read by joins in one CTE, not a sub-select per value: each of
# those cost the server instructions (callgrind: 359k -> 321k a one-check append).
# Parameters $1..$13: stream_id, version, event_id, type, schema_version, payload, recorded_at,
# actor, the header before and after seq, the client's hash, the guessed head's seq + 1 and hash.
_CHAINED_INSERT_ONE = f"""WITH h AS MATERIALIZED (
  SELECT coalesce(last.seq, 0) + 1 AS seq, coalesce(last.hash, '{GENESIS_HASH}') AS prev{{versions}}
  FROM (SELECT) AS one LEFT JOIN (SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1) AS last ON true{{joins}}),
ins AS (
  INSERT INTO events (seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor,
                      prev_hash, hash)
  SELECT h.seq, $1, $2::bigint, $3, $4, $5::integer, $6, $7, $8, h.prev,
         CASE WHEN h.seq = $12::bigint AND h.prev = $13 THEN $11 ELSE
         encode(sha256(convert_to(h.prev || {_NEWLINE} || $9 || h.seq::text || $10 || {_NEWLINE} || $6, 'UTF8')),
                'hex') END
  FROM h WHERE true{{guards}}
  RETURNING seq, prev_hash, hash),
{_INDEX_AND_RESULT}"""


@functools.cache
def _statement(one: bool, checks: int, ids: bool) -> str:
    """The chained insert's text for a shape: numbered parameters, in `chained_insert_sql`'s order."""
    numbers = itertools.count(14)
    pairs = [(next(numbers), next(numbers)) for _ in range(checks)]  # (stream, expected version)
    versions = joins = ""
    if one:
        versions = "".join(f", coalesce(v{n}.version, 0) AS v{n}" for n in range(checks))
        joins = "".join(
            f"\n  LEFT JOIN (SELECT version FROM events WHERE stream_id = ${stream} ORDER BY version DESC LIMIT 1)"
            f" AS v{n} ON true"
            for n, (stream, _) in enumerate(pairs)
        )
        guards = "".join(f" AND h.v{n} = ${expected}" for n, (_, expected) in enumerate(pairs))
    else:
        guards = "".join(
            f" AND coalesce((SELECT max(version) FROM events WHERE stream_id = ${stream}), 0) = ${expected}"
            for stream, expected in pairs
        )
    if ids:
        guards += f" AND NOT EXISTS (SELECT FROM events WHERE event_id = ANY(${next(numbers)}::text[]))"
    if one:
        template, stream, version, order = _CHAINED_INSERT_ONE, 1, 2, ""
    else:
        template, stream, version, order = _CHAINED_INSERT, 12, next(numbers), " ORDER BY seq"
    status, category, channel = next(numbers), next(numbers), next(numbers)
    return template.format(
        versions=versions,
        joins=joins,
        guards=guards,
        order=order,
        stream=stream,
        version=version,
        status=status,
        category=category,
        channel=channel,
    )


def header_parts(
    actor: str, event_id: str, recorded_at: str, schema_version: int, stream_id: str, type_name: str, version: int
) -> tuple[str, str]:
    """The canonical header (see `store.chain`) before and after the `seq` value.

    Keys sort as actor, event_id, recorded_at, schema_version | seq | stream_id, type,
    version, so the two halves are two compact orjson objects with their brace cut off.
    """
    before = orjson.dumps(
        {"actor": actor, "event_id": event_id, "recorded_at": recorded_at, "schema_version": schema_version}
    )
    after = orjson.dumps({"stream_id": stream_id, "type": type_name, "version": version})
    return before[:-1].decode() + ',"seq":', "," + after[1:].decode()


def chained_insert_sql(
    rows: Sequence[tuple[Any, ...]],
    guess: Head,
    checks: Sequence[tuple[str, int]],
    ids: list[str] | None,
    index: tuple[str | None, str | None],
    channel: str,
) -> tuple[str, list[Any]]:
    """The one statement that appends `rows` (`chain_rows` after `guess`) after whatever head it finds,
    only if every `(stream, version)` of `checks` holds and (with `ids`) none of the event ids is taken,
    and upserts the stream index; it returns `(seq, prev_hash, hash, '')` per row, none if refused, and
    notifies `channel` when it inserted (one notification per transaction: PostgreSQL folds repeats).

    When the head it finds is `guess` it stores the client's hashes (the server's sha256 is a
    quarter of the insert's cost); otherwise it chains the rows itself from each row's header
    split around `seq`.
    """
    stream_id, first_version = rows[0][1], rows[0][2]
    parts = [header_parts(r[8], r[3], r[7], r[5], stream_id, r[4], r[2]) for r in rows]
    if len(rows) == 1:
        r, (pre, post) = rows[0], parts[0]
        params: list[Any] = [stream_id, first_version, r[3], r[4], r[5], r[6], r[7], r[8], pre, post, r[10],
                             guess.seq + 1, guess.hash]  # fmt: skip
    else:
        params = [
            [r[3] for r in rows], [r[4] for r in rows], [r[5] for r in rows], [r[6] for r in rows],
            [r[7] for r in rows], [r[8] for r in rows], [p[0] for p in parts], [p[1] for p in parts],
            [r[10] for r in rows], guess.seq, guess.hash, stream_id, first_version - 1,
        ]  # fmt: skip
    params += [v for pair in checks for v in pair]
    if ids is not None:
        params.append(ids)
    if len(rows) > 1:
        params.append(rows[-1][2])
    params += [*index, channel]
    return _statement(len(rows) == 1, len(checks), ids is not None), params


def check_server_chain(returned: Sequence[tuple[Any, ...]], rows: Sequence[tuple[Any, ...]]) -> tuple[StoredEvent, ...]:
    """The stored events: `rows` themselves when the server found the guessed head, else the rows
    as the server chained them, once every returned hash is the one `store.chain` computes."""
    if all(got[:3] == (row[0], row[9], row[10]) for got, row in zip(returned, rows, strict=True)):
        return tuple(StoredEvent(*row) for row in rows)  # the guess held: the client's own hashes
    stored: list[StoredEvent] = []
    prev = returned[0][1]
    for n, ((seq, prev_hash, digest, *_), row) in enumerate(zip(returned, rows, strict=True)):
        _, stream_id, version, event_id, type_name, schema_version, payload, recorded_at, actor = row[:9]
        mine = chain_hash(prev, seq, stream_id, version, event_id, type_name, schema_version,
                          payload, recorded_at, actor)  # fmt: skip
        if prev_hash != prev or digest != mine or (n > 0 and seq != stored[-1].seq + 1):
            raise IntegrityError(
                f"the server chained seq {seq} to hash {digest} but this client computes {mine}: "
                "the ledger's chain does not verify from there (report this, with the server's encoding)",
                seq=seq,
            )
        stored.append(StoredEvent(seq, stream_id, version, event_id, type_name, schema_version,
                                  payload, recorded_at, actor, prev_hash, digest))  # fmt: skip
        prev = digest
    return tuple(stored)
