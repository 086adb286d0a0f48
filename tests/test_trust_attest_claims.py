"""`attest verify --db` checks every claim of a statement against the ledger, not only its signature.

The forged statements here are signed with the ledger's real key, so the signature
holds: only the claims (decision, subjects, ledger id, decisive event) can give them
away. An honest attestation whose decision a later event overturned no longer stands.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Workspace, cli, hand_off_dpo, invoke
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner, SSlibKey  # type: ignore[attr-defined]

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.keys import key_id, load_private_key


@pytest.fixture
def handed_off(ws: Workspace) -> Path:
    return hand_off_dpo(ws)


def _attested(ws: Workspace, db: Path, keys: Path) -> Path:
    out = ws.root / "dpo.intoto.json"
    result = cli(db, "--signing-key", str(keys / "lifecycle-signing.key"), "attest", "dpo-v5", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def _statement(envelope_file: Path) -> JSON:
    return dict(json.loads(base64.b64decode(json.loads(envelope_file.read_text())["payload"])))


def _signed(statement: JSON, keys: Path, out: Path) -> Path:
    """The statement as an envelope signed with the ledger's real key (what a key holder could forge)."""
    key = load_private_key(keys / "lifecycle-signing.key")
    envelope = Envelope(json.dumps(statement, sort_keys=True).encode(), "application/vnd.in-toto+json", {})
    envelope.sign(CryptoSigner(key, SSlibKey.from_crypto(key.public_key(), keyid=key_id(key.public_key()))))
    out.write_text(json.dumps(envelope.to_dict()))
    return out


def _check(file: Path, keys: Path, db: Path) -> tuple[int, str, str]:
    pub = str(keys / "lifecycle-signing.pub")
    result = cli("unused.db", "attest", "verify", str(file), "--pubkey", pub, "--db", str(db))
    return result.returncode, result.stdout, result.stderr


def _one_line_error(err: str) -> None:
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "{'" not in err and "':" not in err, err  # a sentence, no Python dict


def test_an_honest_attestation_is_checked_against_the_ledger(ws: Workspace, handed_off: Path, keys: Path) -> None:
    code, out, err = _check(_attested(ws, handed_off, keys), keys, handed_off)
    assert code == 0 and "checked offline and against the ledger" in out, err


def _forge_decision(s: JSON) -> None:
    s["predicate"]["decision"] = "ready"


def _zero_subject(s: JSON) -> None:
    s["subject"][0]["digest"]["sha256"] = "0" * 64


def _other_ledger(s: JSON) -> None:
    s["predicate"]["ledger_id"] = "0" * 32


def _drop_subject(s: JSON) -> None:
    s["subject"] = s["subject"][1:]


@pytest.mark.parametrize(
    ("forge", "said"),
    [
        (_forge_decision, "decision"),
        (_zero_subject, "subject"),
        (_other_ledger, "ledger"),
        (_drop_subject, "subject"),
    ],
    ids=["decision-ready", "zeroed-subject", "another-ledger-id", "a-subject-left-out"],
)
def test_a_signed_claim_the_ledger_does_not_hold_is_refused(
    ws: Workspace, handed_off: Path, keys: Path, forge: Callable[[JSON], None], said: str
) -> None:
    statement = _statement(_attested(ws, handed_off, keys))
    forge(statement)
    forged = _signed(statement, keys, ws.root / "forged.json")
    code, out, err = _check(forged, keys, handed_off)
    assert (code, out) == (6, ""), err
    _one_line_error(err)
    assert said in err


def test_an_overturned_decision_no_longer_stands(ws: Workspace, handed_off: Path, keys: Path) -> None:
    """A baseline change sends the ready candidate back to received: the attestation names that event."""
    envelope = _attested(ws, handed_off, keys)
    assert invoke(handed_off, "baseline", "activate", str(ws.baseline("sft2"))).exit_code == 0
    log = json.loads(cli(handed_off, "--json", "history", "dpo-v5").stdout)
    overturning = max(e["seq"] for e in log if e["type"] == "EvidenceInvalidated")
    code, out, err = _check(envelope, keys, handed_off)
    assert (code, out) == (6, ""), err
    _one_line_error(err)
    assert "no longer stands" in err and f"seq {overturning} EvidenceInvalidated" in err


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s["predicate"].update(candidate="dpo-v5"),
        lambda s: s["predicate"].update(decisive_event="7"),
        lambda s: s["predicate"].update(ledger_head=None),
        lambda s: s.update(subject="x"),
        lambda s: s["subject"][0].update(digest=["sha256"]),
        lambda s: s["predicate"].update(decision=5),
    ],
    ids=["candidate-string", "decisive-string", "head-null", "subject-string", "digest-list", "decision-number"],
)
def test_a_malformed_predicate_is_one_line_not_a_traceback(
    ws: Workspace, handed_off: Path, keys: Path, edit: Callable[[JSON], None]
) -> None:
    statement = _statement(_attested(ws, handed_off, keys))
    edit(statement)
    forged = _signed(statement, keys, ws.root / "forged.json")
    pub = str(keys / "lifecycle-signing.pub")
    offline = cli("unused.db", "attest", "verify", str(forged), "--pubkey", pub)
    assert offline.returncode == 6, offline.stderr
    _one_line_error(offline.stderr)
    code, _, err = _check(forged, keys, handed_off)
    assert code == 6
    _one_line_error(err)
