"""Signed hand-off attestations: a DSSE envelope (`securesystemslib`) holding an in-toto Statement v1.

The subjects are the adapters' sha256, the predicate the hand-off decision, its reason codes, the
decisive event and the ledger's head. `verify_attestation` checks the signature offline and, given
the ledger, every claim against it, and that no later event overturned the decision.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any

import attrs
import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey  # type: ignore[attr-defined]  # re-exported, not in __all__

from lifecycle_fsm.candidate_events import HandoffDecided
from lifecycle_fsm.errors import ConflictError, InputError, IntegrityError, NotFoundError
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.keys import key_id
from lifecycle_fsm.seals import ledger_id_of
from lifecycle_fsm.store.base import EventStore, event_at, verify_chain
from lifecycle_fsm.store.records import ChainReport, StoredEvent
from lifecycle_fsm.streams import fold_candidate
from lifecycle_fsm.upcasting import decoded_payload

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "lifecycle-fsm/handoff/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"


def _ssl_key(public: Ed25519PublicKey) -> SSlibKey:
    return SSlibKey.from_crypto(public, keyid=key_id(public))


def _check_summary(check: Any) -> JSON | None:
    """What an evaluator needs of an artifact check (the per-file listing stays in the ledger)."""
    if not isinstance(check, dict):
        return None
    return {k: check.get(k) for k in ("path", "expected", "actual", "verified", "error")}


def _subjects(handoff: JSON) -> list[JSON]:
    """The Statement's subjects: each adapter the hand-off hashed, with the sha256 it recorded."""
    subjects = []
    for name, check in (("candidate-adapter", handoff.get("artifact")), ("baseline-adapter", handoff.get("rollback"))):
        digest = check.get("actual") if isinstance(check, dict) else None
        if isinstance(check, dict) and isinstance(digest, str):
            subjects.append({"name": f"{name}:{check.get('path')}", "digest": {"sha256": digest}})
    return subjects


def _statement(store: EventStore, candidate_id: str) -> JSON:
    """The in-toto Statement, its state and `ledger_head` read in one snapshot (never a decision a later
    event overturned attested at a head past that event)."""
    with store.read_snapshot():
        events = store.read_stream(stream_of(candidate_id))
        head = _intact_chain(store).head  # what `attest verify --db` walks: never a head it would refuse
        ledger_id = ledger_id_of(store)
    state = fold_candidate(events)  # every row's own hash is checked as it is decoded
    if state is None:
        raise NotFoundError(f"unknown candidate: {candidate_id!r}", candidate_id=candidate_id)
    handoff = state.last_handoff
    if handoff is None or state.decisive_type != HandoffDecided.TYPE or state.decisive_seq != handoff["seq"]:
        raise ConflictError(
            f"candidate {candidate_id!r} ({state.state}) has no standing hand-off decision to attest "
            f"(its state was last decided by {state.decisive_type}); a candidate that may still be handed off "
            "needs `lifecycle handoff` first"
        )
    decisive = next(e for e in events if e.seq == handoff["seq"])
    subjects = _subjects(handoff)
    if not subjects:
        raise ConflictError(f"candidate {candidate_id!r}: no adapter could be hashed at hand-off; nothing to attest")
    candidate = state.candidate
    predicate = {
        "candidate": {
            "id": candidate_id,
            "kind": state.kind,
            "policy_version": candidate.get("policy_version"),
            "source_policy_version": candidate.get("source_policy_version"),
            "manifest_sha256": state.manifest_sha256,
        },
        "decision": handoff["handoff_status"],
        "reason_codes": list(handoff.get("reason_codes") or []),
        "decisive_event": {"seq": decisive.seq, "hash": decisive.hash, "type": decisive.type},
        "ledger_head": {"seq": head.seq, "hash": head.hash},
        "ledger_id": ledger_id,
        "checks": {k: handoff.get(k) for k in ("freshness", "hard_failures", "upstream_decision", "settings")}
        | {k: _check_summary(handoff.get(k)) for k in ("artifact", "rollback")},
    }
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def attest(store: EventStore, candidate_id: str, key: Ed25519PrivateKey) -> JSON:
    """The candidate's hand-off as a signed DSSE envelope (a dict, as DSSE's JSON form). Appends nothing."""
    statement = _statement(store, candidate_id)
    envelope = Envelope(orjson.dumps(statement, option=orjson.OPT_SORT_KEYS), PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(key, _ssl_key(key.public_key())))
    return envelope.to_dict()


def _envelope(doc: Any, source: str) -> Envelope:
    if not isinstance(doc, dict) or not {"payload", "payloadType", "signatures"} <= doc.keys():
        raise InputError(f"{source}: not a DSSE envelope (payload, payloadType, signatures)")
    signatures = doc["signatures"]
    if not isinstance(doc["payload"], str) or not isinstance(signatures, list):
        raise InputError(f"{source}: not a DSSE envelope (payload is a base64 string, signatures a list)")
    for sig in signatures:  # the library calls .encode on each: a number or null was an AttributeError
        if not isinstance(sig, dict) or not all(isinstance(sig.get(k), str) for k in ("keyid", "sig")):
            raise InputError(f"{source}: not a DSSE envelope (each signature is an object of keyid and sig strings)")
    try:
        return Envelope.from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as e:
        raise InputError(f"{source}: not a DSSE envelope ({e})") from e


def verify_attestation(
    text: bytes, public_keys: list[Ed25519PublicKey], *, source: str, store: EventStore | None = None
) -> JSON:
    """Check the signature and the Statement's shape; with `store`, its claims against that ledger.
    A bad signature or claim is an `IntegrityError` (exit 6); a file that is not an envelope an `InputError`."""
    if not public_keys:
        raise InputError("attest verify needs at least one --pubkey")
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise InputError(f"{source}: not JSON ({e})") from e
    envelope = _envelope(doc, source)
    if envelope.payload_type != PAYLOAD_TYPE:
        raise IntegrityError(f"{source}: payload type {envelope.payload_type!r}, expected {PAYLOAD_TYPE}")
    try:
        accepted = envelope.verify([_ssl_key(k) for k in public_keys], 1)
    except VerificationError as e:
        raise IntegrityError(f"{source}: the signature does not verify under the given keys ({e})") from e
    try:
        statement = orjson.loads(envelope.payload)
    except orjson.JSONDecodeError as e:  # signed, yet not JSON: not ours
        raise IntegrityError(f"{source}: the signed payload is not JSON ({e})") from e
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise IntegrityError(f"{source}: the payload is not an in-toto Statement v1")
    if statement.get("predicateType") != PREDICATE_TYPE or not isinstance(statement.get("predicate"), dict):
        raise IntegrityError(f"{source}: predicate type {statement.get('predicateType')!r}, expected {PREDICATE_TYPE}")
    claims = _claims(statement, source)
    report: JSON = {
        "ok": True,
        "key_ids": sorted(accepted),
        "candidate": claims.candidate,
        "decision": claims.decision,
        "subject": statement["subject"],
        "decisive_event": statement["predicate"]["decisive_event"],
        "ledger_head": statement["predicate"]["ledger_head"],
        "checked_against_ledger": store is not None,
    }
    if store is not None:
        with store.read_snapshot():
            _check_in_ledger(store, claims, source)
    return report


@attrs.frozen
class _Claims:
    """What a signed Statement claims, each part of the type `attest` writes."""

    candidate: str
    decision: str
    reason_codes: tuple[str, ...]
    subject: tuple[tuple[str, str], ...]  # (name, sha256), sorted
    ledger_id: str
    decisive_event: tuple[int, str]  # (seq, hash)
    ledger_head: tuple[int, str]


def _pin(value: Any) -> tuple[int, str] | None:
    seq, digest = (value.get("seq"), value.get("hash")) if isinstance(value, dict) else (None, None)
    if isinstance(seq, int) and not isinstance(seq, bool) and isinstance(digest, str):
        return seq, digest
    return None


def _subject_pairs(subjects: Any) -> tuple[tuple[str, str], ...] | None:
    if not isinstance(subjects, list):
        return None
    pairs = []
    for subject in subjects:
        digest = subject.get("digest") if isinstance(subject, dict) else None
        sha = digest.get("sha256") if isinstance(digest, dict) else None
        if not isinstance(sha, str) or not isinstance(subject.get("name"), str):
            return None
        pairs.append((subject["name"], sha))
    return tuple(sorted(pairs))


def _claims(statement: JSON, source: str) -> _Claims:
    """The Statement's claims, or an IntegrityError naming the first part that is not what `attest` writes."""
    predicate = statement["predicate"]
    candidate = predicate.get("candidate")
    candidate_id = candidate.get("id") if isinstance(candidate, dict) else None
    reasons = predicate.get("reason_codes")
    parts: JSON = {
        "candidate": candidate_id if isinstance(candidate_id, str) else None,
        "decision": predicate.get("decision") if isinstance(predicate.get("decision"), str) else None,
        "reason_codes": (
            tuple(reasons) if isinstance(reasons, list) and all(isinstance(r, str) for r in reasons) else None
        ),
        "subject": _subject_pairs(statement.get("subject")),
        "ledger_id": predicate.get("ledger_id") if isinstance(predicate.get("ledger_id"), str) else None,
        "decisive_event": _pin(predicate.get("decisive_event")),
        "ledger_head": _pin(predicate.get("ledger_head")),
    }
    for name, value in parts.items():
        if value is None:
            raise IntegrityError(f"{source}: the statement's {name} is missing or not as `attest` writes it")
    return _Claims(**parts)


def _check_in_ledger(store: EventStore, claims: _Claims, source: str) -> None:
    """Every claim must be what this ledger recorded, and the decision must still stand. The whole chain is
    re-hashed first, so a stored hash equal to the attested one proves the row and all before it."""
    _intact_chain(store)
    for what, (seq, digest) in (("decisive event", claims.decisive_event), ("ledger head", claims.ledger_head)):
        event = event_at(store, seq)
        if event is None or event.hash != digest:
            raise IntegrityError(
                f"{source}: the attested {what}, seq {seq} (hash {digest}), is not in this ledger's chain", seq=seq
            )
    ledger_id = ledger_id_of(store)
    if claims.ledger_id != ledger_id:
        raise IntegrityError(f"{source}: attested for ledger {claims.ledger_id}, but this ledger's id is {ledger_id}")
    cid = claims.candidate
    decisive = event_at(store, claims.decisive_event[0])
    if decisive is None or decisive.type != HandoffDecided.TYPE or decisive.stream_id != stream_of(cid):
        raise IntegrityError(f"{source}: the decisive event is not {cid!r}'s hand-off in this ledger")
    recorded = decoded_payload(decisive)
    if claims.decision != recorded.get("handoff_status"):
        raise IntegrityError(
            f"{source}: attests decision {claims.decision!r}, but the ledger decided "
            f"{recorded.get('handoff_status')!r} at seq {decisive.seq}",
            seq=decisive.seq,
        )
    if claims.reason_codes != tuple(recorded.get("reason_codes") or ()):
        raise IntegrityError(
            f"{source}: attests reason codes {', '.join(claims.reason_codes) or 'none'}, not those the ledger "
            f"recorded at seq {decisive.seq}",
            seq=decisive.seq,
        )
    expected = {(s["name"], s["digest"]["sha256"]) for s in _subjects(recorded)}
    if set(claims.subject) != expected or len(claims.subject) != len(expected):
        wrong = sorted(set(claims.subject) ^ expected)
        name, sha = wrong[0] if wrong else claims.subject[0]
        raise IntegrityError(
            f"{source}: the subjects are not the adapters the ledger hashed at seq {decisive.seq} "
            f"(subject {name} sha256 {sha} differs)",
            seq=decisive.seq,
        )
    overturned = _overturning_event(store.read_stream(stream_of(cid)), decisive.seq)
    if overturned is not None:
        raise IntegrityError(
            f"{source}: the attested decision no longer stands: seq {overturned.seq} {overturned.type} "
            f"moved {cid!r} on from the hand-off at seq {decisive.seq}",
            seq=overturned.seq,
        )


def _intact_chain(store: EventStore) -> ChainReport:
    """The whole chain re-hashed and linked, or IntegrityError at its first broken seq."""
    chain = verify_chain(store)
    if not chain.ok:
        raise IntegrityError(f"the ledger's chain is broken at seq {chain.bad_seq}: {chain.reason}", seq=chain.bad_seq)
    return chain


def _overturning_event(events: Sequence[StoredEvent], decisive_seq: int) -> StoredEvent | None:
    """The first later event of the candidate's stream after which `decisive_seq` no longer decides its state."""
    state = fold_candidate([e for e in events if e.seq <= decisive_seq])
    for event in (e for e in events if e.seq > decisive_seq):
        state = fold_candidate([event], start=state)
        if state is None or state.decisive_seq != decisive_seq:
            return event
    return None
