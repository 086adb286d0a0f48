"""Sealed and pinned heads: proving the log was not truncated or re-hashed.

A seal (`HeadSealed`, in the `seals` stream) signs `{ledger_id, seq, hash}` of the head right
before it; `seal` returns that signed head. A pinned head is one an auditor kept outside the file
(`SEQ:HASH` or a signed-head file `seal` wrote), parsed strictly: a typo is named.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import attrs
import orjson

from lifecycle_fsm.errors import (
    ConcurrencyError,
    ConflictError,
    CorruptionError,
    DuplicateEventError,
    InputError,
    IntegrityError,
)
from lifecycle_fsm.events import SEALS_STREAM, HeadSealed, LedgerInitialized
from lifecycle_fsm.findings import add_problem, problem
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.keys import PublicKeys, key_id, sign
from lifecycle_fsm.limits import MAX_INT64, MAX_SIGNED_HEAD_BYTES, check_event_id, display, read_regular_file
from lifecycle_fsm.manifests import check_key, recorded_time
from lifecycle_fsm.store.base import EventStore, event_at, hash_at
from lifecycle_fsm.store.chain import GENESIS, TIME_FORM_BREAK, ChainWalk, canonical_json
from lifecycle_fsm.store.records import EventFilter, Head, NewEvent, StoredEvent
from lifecycle_fsm.upcasting import decoded_payload, derived_ledger_id

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_SIGNED_HEAD_FIELDS = ("ledger_id", "seq", "hash", "sealed_at", "key_id", "signature")  # in `seal --json`'s order


def ledger_id_of(store: EventStore) -> str | None:
    """The ledger's id (None for an empty ledger): fixed by its first event."""
    first = event_at(store, 1)
    if first is None:
        return None
    if first.type == LedgerInitialized.TYPE:
        found = decoded_payload(first).get("ledger_id")  # v1 rows are upcast from their hash
        if isinstance(found, str) and found:
            return found
    return derived_ledger_id(first.hash)


def seal_message(ledger_id: str, seq: int, digest: str) -> bytes:
    """The exact bytes a seal signs: canonical JSON of `{ledger_id, seq, hash}`."""
    return canonical_json({"hash": digest, "ledger_id": ledger_id, "seq": seq}).encode()


def seal(
    store: EventStore,
    key: Ed25519PrivateKey,
    *,
    actor: str,
    clock: Callable[[], str],
    before_commit: Callable[[JSON], None] | None = None,
    checked: Head | None = None,
    event_id: str | None = None,
) -> JSON:
    """Append a `HeadSealed` signing the head before it (read inside the write transaction); return the
    signed head (`seal --json`). `before_commit` gets it before the commit: a file written there exists
    before the seal does, and a failure appends nothing. `checked`: what `sealable_head` returned for
    this key. `event_id`: the idempotency key; a seal already stored under it is answered."""
    check_key(event_id)
    check_event_id(event_id)  # the rule every command's key follows
    ledger_id = ledger_id_of(store)
    if ledger_id is None:
        raise ConflictError("the ledger is empty: there is no head to seal yet")
    if event_id is not None and (done := sealed_under(store, event_id)) is not None:
        return done
    # The rows since the last seal that holds, walked outside the lock; the few appended meanwhile, under it.
    checked = checked if checked is not None else sealable_head(store, key)
    for _ in range(20):
        with contextlib.suppress(ConcurrencyError):  # another writer appended meanwhile: sign the new head
            try:
                return _append_seal(store, key, ledger_id, actor, clock, before_commit, checked, event_id)
            except DuplicateEventError:  # the same keyed seal, run at the same time, landed first: its answer
                done = None if event_id is None else sealed_under(store, event_id)
                if done is None:
                    raise
                return done
    raise ConcurrencyError(
        "could not seal: other writers kept appending; retry the command",
        stream_id=SEALS_STREAM,
        expected_version=0,
        actual_version=0,
    )


def sealable_head(store: EventStore, key: Ed25519PrivateKey) -> Head:
    """The head `key` may seal: every row since the latest seal that holds under it re-hashed and linked.
    IntegrityError at an edited row, or when a seal this key signed names a head the chain no longer has."""
    ledger_id = ledger_id_of(store)
    if ledger_id is None:
        return GENESIS
    keys, start = PublicKeys([key.public_key()]), GENESIS
    for event in reversed(store.read_stream(SEALS_STREAM)):
        with contextlib.suppress(CorruptionError):  # an unreadable seal: the one before
            payload = decoded_payload(event)
            if _seal_failure(store, event, payload, keys, ledger_id) is None:
                start = Head(payload["seq"], payload["hash"])
                break
            # A well-formed seal signed under `keys` for this ledger, naming a head the chain no longer has.
            rewritten = _seal_problem(payload) is None and hash_at(store, payload["seq"]) != payload["hash"]
            if rewritten and _signed(keys, ledger_id, payload):
                raise IntegrityError(
                    f"seq {payload['seq']}: this key sealed head {payload['seq']}:{payload['hash']} (seal at seq "
                    f"{event.seq}) and the chain holds other bytes there now; nothing sealed: run `lifecycle verify`",
                    seq=payload["seq"],
                )
    return _walked(store, start)


def _signed(keys: PublicKeys, ledger_id: str | None, doc: JSON) -> bool:
    """Whether `doc`'s signature over this ledger's `{ledger_id, seq, hash}` verifies under `keys`."""
    message = seal_message(str(ledger_id), doc["seq"], doc["hash"])
    return keys.verifies(str(doc.get("key_id")), message, str(doc.get("signature")))


def _walked(store: EventStore, start: Head) -> Head:
    """Re-hash and link every row after `start`: the head reached, or IntegrityError at the first edited row."""
    walk = ChainWalk(store.select_rows(EventFilter(after=start.seq)), start=start)
    walk.finish()
    if walk.bad_seq is not None:
        raise IntegrityError(
            f"seq {walk.bad_seq}: {walk.reason}; nothing sealed: run `lifecycle verify`", seq=walk.bad_seq
        )
    return walk.report(count=store.count_events, head=store.head).head


def signed_head_text(doc: JSON) -> str:
    """The signed-head file: the `seal --json` object, indented, one trailing newline."""
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def _append_seal(
    store: EventStore,
    key: Ed25519PrivateKey,
    ledger_id: str,
    actor: str,
    clock: Callable[[], str],
    before_commit: Callable[[JSON], None] | None,
    checked: Head,
    event_id: str | None,
) -> JSON:
    """One attempt: the seal must land right after the head it signs, or nothing is kept."""
    with store.transaction() as tx:
        head = store.head()
        if head.seq > checked.seq:
            _walked(store, checked)
        signature = sign(key, seal_message(ledger_id, head.seq, head.hash))
        event = HeadSealed(ledger_id, head.seq, head.hash, key_id(key.public_key()), signature)
        payload, at = event.to_payload(), recorded_time(clock())
        new = NewEvent(SEALS_STREAM, event.TYPE, event.SCHEMA_VERSION, payload, event_id or uuid.uuid4().hex, at, actor)
        stored = tx.append(SEALS_STREAM, tx.stream_version(SEALS_STREAM), [new], fresh_ids=event_id is None).events[0]
        if stored.seq != head.seq + 1:  # raised inside the transaction: rolled back
            raise ConcurrencyError(
                "the head moved while sealing",
                stream_id=SEALS_STREAM,
                expected_version=head.seq + 1,
                actual_version=stored.seq,
            )
        signed = _signed_head(payload, stored.recorded_at)
        if before_commit is not None:
            before_commit(signed)
    return signed


def _signed_head(payload: JSON, sealed_at: str) -> JSON:
    """The signed head a seal returns, from its `HeadSealed` payload."""
    fields = {**payload, "sealed_at": sealed_at}
    return {k: fields[k] for k in _SIGNED_HEAD_FIELDS}


def sealed_under(store: EventStore, event_id: str) -> JSON | None:
    """The signed head the seal keyed `event_id` returned; None when the key is new (DuplicateEventError when
    another command's event holds it)."""
    stored = store.event_by_id(event_id)
    if stored is None:
        return None
    if stored.type != HeadSealed.TYPE:  # (only ever on the seals stream: the fold refuses it elsewhere)
        raise DuplicateEventError(
            f"event id {event_id!r} is already used at seq {stored.seq} by {stored.type}: give the seal a new one",
            event_id=event_id,
            seq=stored.seq,
        )
    return _signed_head(decoded_payload(stored), stored.recorded_at)


def _failure(bad_seq: int | None, code: str, message: str) -> JSON:
    """A seal or pinned head that fails, as `verify` reports it: head_mismatch, seal_mismatch, seal_signature."""
    return problem(code, bad_seq, code, message=message)


def check_expected_head(
    store: EventStore,
    pin: ExpectedHead,
    keys: PublicKeys,
    ledger_id: str | None,
    broken_at: int | None = None,
) -> JSON | None:
    """A pinned head must be in the chain recomputed from the rows exactly (at or past `broken_at`, where
    the chain breaks, it is not); a signed-head file's signature must hold too."""
    other = None if pin.signed is None else pin.signed.get("ledger_id")
    if ledger_id is not None and other is not None and other != ledger_id:
        message = (
            f"{pin.source} is a head of another ledger (ledger id {display(str(other))}; this one's is {ledger_id})"
        )
        return _failure(pin.seq, "head_mismatch", message)
    found = hash_at(store, pin.seq)
    if found != pin.hash:
        what = "no event" if found is None else f"hash {found}"
        named = "" if pin.source == f"{pin.seq}:{pin.hash}" else f" ({pin.source})"
        message = f"expected head {pin.seq}:{pin.hash}{named}, the ledger has {what} there"
        return _failure(pin.seq, "head_mismatch", message)
    if broken_at is not None and pin.seq >= broken_at:
        return _failure(pin.seq, "head_mismatch", f"expected head {pin.seq}:{pin.hash}: {_past(broken_at)}")
    if pin.signed is not None and keys and not (other == ledger_id and _signed(keys, ledger_id, pin.signed)):
        message = f"{pin.source}: its signature does not verify under the given keys for this ledger"
        return _failure(pin.seq, "seal_signature", message)
    return None


def _seal_problem(payload: JSON) -> str | None:
    """What makes a stored seal malformed (a field missing or of the wrong type), or None."""
    for name in ("ledger_id", "hash", "key_id", "signature"):
        if not isinstance(payload.get(name), str):
            return f"its {name} is missing or not text"
    sealed_seq = payload.get("seq")
    if not isinstance(sealed_seq, int) or isinstance(sealed_seq, bool):
        return "its seq is missing or not a whole number"
    return None


def check_seals(
    store: EventStore, keys: PublicKeys, ledger_id: str | None, broken_at: int | None = None
) -> tuple[JSON, JSON | None]:
    """The `seals` summary `verify --json` prints, and the first failing seal (or None); a head at or past
    `broken_at` (where the chain breaks) is not the recomputed chain's."""
    events, signers = store.read_stream(SEALS_STREAM), set()
    failure: JSON | None = None
    for event in events:
        try:
            payload = decoded_payload(event)
        except CorruptionError as e:
            failure = failure or _failure(event.seq, "seal_mismatch", str(e))
            continue
        if isinstance(payload.get("key_id"), str):
            signers.add(payload["key_id"])
        failure = failure or _seal_failure(store, event, payload, keys, ledger_id)
        if failure is None and broken_at is not None and payload["seq"] >= broken_at:
            failure = _failure(event.seq, "seal_mismatch", f"seq {event.seq}: the sealed head {_past(broken_at)}")
    return {"count": len(events), "keys": sorted(signers), "last_seq": events[-1].seq if events else None}, failure


def _past(broken_at: int) -> str:
    return f"is at or past seq {broken_at}, where the chain breaks: the chain recomputed from the rows is not that hash"


def _seal_failure(
    store: EventStore, event: StoredEvent, payload: JSON, keys: PublicKeys, ledger_id: str | None
) -> JSON | None:
    """Why one stored seal does not hold, or None: it must seal this ledger's head right before it (an old
    seal appended again proves nothing), and with `keys`, verify under one of them."""
    if event.type != HeadSealed.TYPE:
        return _failure(event.seq, "seal_mismatch", f"seq {event.seq}: {event.type} in seals")
    if (problem := _seal_problem(payload)) is not None:
        return _failure(event.seq, "seal_mismatch", f"seq {event.seq}: a malformed seal ({problem})")
    if payload["seq"] != event.seq - 1:
        message = (
            f"seq {event.seq}: the seal claims head seq {payload['seq']}, not the head before it "
            f"(seq {event.seq - 1}): a seal copied from elsewhere in the log"
        )
        return _failure(event.seq, "seal_mismatch", message)
    if hash_at(store, event.seq - 1) != payload["hash"] or payload["ledger_id"] != ledger_id:
        message = f"seq {event.seq}: the sealed head {payload['seq']}:{payload['hash']} is not this ledger's chain"
        return _failure(event.seq, "seal_mismatch", message)
    if keys and not _signed(keys, ledger_id, payload):
        message = f"seq {event.seq}: the seal's signature does not verify under the given keys"
        return _failure(event.seq, "seal_signature", message)
    return None


def add_trust_findings(
    store: EventStore, report: JSON, heads: Iterable[ExpectedHead] = (), keys: PublicKeys | None = None
) -> JSON:
    """`verify`'s report plus `seals`, every pinned head that fails and the first seal that does: evidence
    kept outside the file, always among the problems whatever else `verify` found."""
    keys = keys if keys is not None else PublicKeys()
    try:
        ledger_id = ledger_id_of(store)
    except IntegrityError:  # its first row edited: no ledger to vouch for (the chain's break at seq 1 says so)
        ledger_id = None
    breaks = [p for p in report.get("problems", []) if p["code"] == "chain"]
    # Where the chain recomputed from the rows stops holding (a row's time form aside: its hashes hold).
    broken = next((p["bad_seq"] for p in breaks if TIME_FORM_BREAK not in p["reason"]), None)
    summary, sealed = check_seals(store, keys, ledger_id, broken)
    report["seals"] = summary
    pinned = [check_expected_head(store, pin, keys, ledger_id, broken) for pin in heads]
    for failure in [*pinned, sealed]:
        if failure is not None:
            add_problem(report, failure)
    return report


_HASH = re.compile(r"[0-9a-f]{64}")  # a sha256 as the chain stores it (and `verify --json` prints it)
# What a `SEQ:HASH` was meant to be: a (signed) whole number before the colon, or hex digits after it.
# A value of that shape that is no file is judged as a pin, so a typo is named, not "no such file".
_PIN_SHAPE = re.compile(r"([+-]?[0-9]+):(\S*)|([^\s/:]*):([0-9A-Fa-f]+)", re.ASCII)


@attrs.frozen
class ExpectedHead:
    """A head an auditor kept outside the file: `SEQ:HASH`, or a signed-head file."""

    seq: int
    hash: str
    source: str
    signed: JSON | None = None  # the signed-head document, when read from a file


def parse_expected_head(value: str) -> ExpectedHead:
    """`SEQ:HASH` (a seq from 1, the 64-lowercase-hex hash there), or the path of a file `seal` wrote; a
    value of that shape that is no file and not a pin is refused saying which part is wrong."""
    if (pin := _PIN_SHAPE.fullmatch(value.strip())) is not None:
        seq_text, digest = pin.group(1, 2) if pin.group(1) is not None else pin.group(3, 4)
        problem = _seq_problem(seq_text) or _hash_problem(digest)
        # A well-formed `SEQ:HASH` wins over a file of that name, as it always has.
        if not os.path.lexists(value) or (pin.group(1) is not None and not problem):
            if problem:
                raise InputError(
                    f"--expect-head {value!r}: {problem}; give SEQ:HASH as `verify --json` prints the head"
                )
            return ExpectedHead(int(seq_text.lstrip("0")), digest, value)  # leading zeros: not for int() to count
    try:  # a FIFO, a device or a huge file is refused, never read without end
        text = read_regular_file(value, what="file", limit=MAX_SIGNED_HEAD_BYTES)
    except InputError as e:
        shape = "SEQ:HASH (a seq and the 64-hex-digit hash)"
        raise InputError(f"--expect-head {value!r} is neither {shape} nor a readable signed-head file ({e})") from None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InputError(f"{value}: not a signed-head file (not JSON: {e})") from e
    if not isinstance(doc, dict):
        raise InputError(f"{value}: not a signed-head file (not an object)")
    seq, digest = doc.get("seq"), doc.get("hash")
    if type(seq) is not int or _seq_problem(str(seq)) or not isinstance(digest, str) or _hash_problem(digest):
        raise InputError(
            f"{value}: a signed-head file needs an integer `seq` from 1 and a `hash` of 64 lowercase hex digits"
        )
    return ExpectedHead(seq, digest, os.fspath(value), doc)


def _seq_problem(text: str) -> str | None:
    """Why `text` is not a seq a pinned head can name: a whole number from 1 (seq 0 is the genesis, no event)."""
    if not (text.isascii() and text.isdigit()):
        return f"the seq {text!r} is not a whole number from 1"
    digits = text.lstrip("0")
    if not digits:
        return "seq 0 is not an event (the chain starts at seq 1)"
    if len(digits) > 19 or int(digits) > MAX_INT64:  # (int() refuses 4300+ digits: never asked)
        return "no seq is that large"
    return None


def _hash_problem(digest: str) -> str | None:
    """Why `digest` is not a hash of the chain: 64 lowercase hex digits."""
    if _HASH.fullmatch(digest):
        return None
    if _HASH.fullmatch(digest.lower()):
        found = "it is in upper case"
    elif re.fullmatch(r"[0-9A-Fa-f]*", digest):
        found = f"it has {len(digest)} hex digits" if digest else "it is empty"
    else:
        found = "it has a character that is not a hex digit"
    return f"the hash is not 64 lowercase hex digits ({found})"
