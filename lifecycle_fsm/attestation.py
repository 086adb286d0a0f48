"""Signed hand-off attestations: a DSSE envelope holding an in-toto Statement v1 (SPEC §8).

An evaluation team receives a candidate with a file it can check offline: the
candidate's (and the baseline's) adapter sha256 as the Statement's subjects, and the
hand-off decision, its reason codes, the decisive event and the ledger's head as the
predicate. The envelope is DSSE, signed with the ledger's Ed25519 key through
`securesystemslib` (a maintained DSSE implementation: its PAE, its envelope format),
with the key id `lifecycle key new` prints. `verify_attestation` checks the signature
offline and, given the ledger, that the decisive event and the head are in its chain.
"""

from __future__ import annotations

import binascii
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey  # type: ignore[attr-defined]  # re-exported, not in __all__

from lifecycle_fsm.errors import ConflictError, InputError, IntegrityError, NotFoundError
from lifecycle_fsm.events import HandoffDecided, stream_of
from lifecycle_fsm.keys import key_id
from lifecycle_fsm.seals import ledger_id_of
from lifecycle_fsm.store.base import EventStore, event_at, verify_chain
from lifecycle_fsm.streams import fold_candidate

__all__ = ["PAYLOAD_TYPE", "PREDICATE_TYPE", "STATEMENT_TYPE", "attest", "verify_attestation"]

JSON = dict[str, Any]
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


def _statement(store: EventStore, candidate_id: str) -> JSON:
    """The in-toto Statement, its state and `ledger_head` read in one snapshot: a decision a
    later event overturned is never attested at a head past that event."""
    with store.read_snapshot():
        return _statement_at_snapshot(store, candidate_id)


def _statement_at_snapshot(store: EventStore, candidate_id: str) -> JSON:
    events = store.read_stream(stream_of(candidate_id))
    state = fold_candidate(events)  # every row's own hash is checked as it is decoded
    if state is None:
        raise NotFoundError(f"unknown candidate: {candidate_id!r}")
    handoff = state.last_handoff
    if handoff is None or state.decisive_type != HandoffDecided.TYPE or state.decisive_seq != handoff["seq"]:
        raise ConflictError(
            f"candidate {candidate_id!r} ({state.state}) has no standing hand-off decision to attest "
            f"(its state was last decided by {state.decisive_type}); a candidate that may still be handed off "
            "needs `lifecycle handoff` first"
        )
    decisive = next(e for e in events if e.seq == handoff["seq"])
    head = store.head()
    subjects = []
    for name, check in (("candidate-adapter", handoff.get("artifact")), ("baseline-adapter", handoff.get("rollback"))):
        digest = check.get("actual") if isinstance(check, dict) else None
        if isinstance(check, dict) and isinstance(digest, str):
            subjects.append({"name": f"{name}:{check.get('path')}", "digest": {"sha256": digest}})
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
        "ledger_id": ledger_id_of(store),
        "checks": {
            "freshness": handoff.get("freshness"),
            "hard_failures": handoff.get("hard_failures"),
            "upstream_decision": handoff.get("upstream_decision"),
            "settings": handoff.get("settings"),
            "artifact": _check_summary(handoff.get("artifact")),
            "rollback": _check_summary(handoff.get("rollback")),
        },
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
    """Check the signature (and the Statement's shape); with `store`, that its events are in that chain.

    A bad signature, a key not given, or a ledger that does not hold the attested
    events is an `IntegrityError` (exit 6); a file that is not an envelope, an
    `InputError` (exit 3).
    """
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
    predicate = statement["predicate"]
    report: JSON = {
        "ok": True,
        "key_ids": sorted(accepted),
        "candidate": predicate.get("candidate", {}).get("id"),
        "decision": predicate.get("decision"),
        "subject": statement.get("subject"),
        "decisive_event": predicate.get("decisive_event"),
        "ledger_head": predicate.get("ledger_head"),
        "checked_against_ledger": store is not None,
    }
    if store is not None:
        _check_in_ledger(store, predicate, source)
    return report


def _check_in_ledger(store: EventStore, predicate: JSON, source: str) -> None:
    """The attested decisive event and head must be rows of this ledger's intact chain.

    The whole chain is re-hashed first, so a stored hash equal to the attested one
    proves the row (and everything before it, the ledger id's first event included)
    is what was attested: an edited row breaks the chain, a re-hashed one the hash.
    """
    chain = verify_chain(store)
    if not chain.ok:
        raise IntegrityError(f"the ledger's chain is broken at seq {chain.bad_seq}: {chain.reason}", seq=chain.bad_seq)
    for name in ("decisive_event", "ledger_head"):
        pin = predicate.get(name)
        seq = pin.get("seq") if isinstance(pin, dict) else None
        event = event_at(store, seq) if isinstance(seq, int) else None
        if event is None or not isinstance(pin, dict) or event.hash != pin.get("hash"):
            shown = f"seq {seq} (hash {pin.get('hash')})" if isinstance(pin, dict) else "(none given)"
            what = name.replace("_", " ")
            raise IntegrityError(f"{source}: the attested {what}, {shown}, is not in this ledger's chain", seq=seq)
    decisive = event_at(store, predicate["decisive_event"]["seq"])
    candidate = predicate.get("candidate", {}).get("id")
    if decisive is None or decisive.type != HandoffDecided.TYPE or decisive.stream_id != stream_of(str(candidate)):
        raise IntegrityError(f"{source}: the decisive event is not {candidate!r}'s hand-off in this ledger")
