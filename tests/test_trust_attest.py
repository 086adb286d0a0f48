"""Hand-off attestations (SPEC §8): DSSE + in-toto Statement v1, checked offline and against a ledger."""

from __future__ import annotations

import base64
import json
import re
import sqlite3
from pathlib import Path

import pytest
from conftest import Workspace, cli, count_events, hand_off_dpo, invoke
from securesystemslib.dsse import Envelope

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.store.chain import GENESIS_HASH, event_hash


@pytest.fixture
def handed_off(ws: Workspace) -> Path:
    """The DPO candidate handed off (ready) and a GRPO one received, not yet decided."""
    db = hand_off_dpo(ws)
    assert invoke(db, "receive", str(ws.grpo())).exit_code == 0
    return db


def _attest(db: Path, keys: Path, candidate: str, out: Path) -> tuple[int, str]:
    result = cli(db, "--signing-key", str(keys / "lifecycle-signing.key"), "attest", candidate, "--out", str(out))
    return result.returncode, result.stderr


def _check(file: Path, keys: Path, *extra: str) -> tuple[int, str, str]:
    result = cli(
        "unused.db", "attest", "verify", str(file), "--pubkey", str(keys / "lifecycle-signing.pub"), "--json", *extra
    )
    return result.returncode, result.stdout, result.stderr


def test_an_attestation_is_a_signed_in_toto_statement_about_the_adapters(
    ws: Workspace, handed_off: Path, keys: Path
) -> None:
    out = ws.root / "dpo.intoto.json"
    before = count_events(handed_off)
    code, err = _attest(handed_off, keys, "dpo-v5", out)
    assert code == 0, err
    assert count_events(handed_off) == before  # appends nothing
    doc = json.loads(out.read_text())
    assert doc["payloadType"] == "application/vnd.in-toto+json"
    key_id = json.loads(cli(ws.db, "key", "new", "--out", str(ws.root / "k2"), "--json").stdout)["key_id"]
    assert doc["signatures"][0]["keyid"] != key_id  # the signer's own id, not any key's
    statement = json.loads(base64.b64decode(doc["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "lifecycle-fsm/handoff/v1"
    digests = {s["name"].split(":")[0]: s["digest"]["sha256"] for s in statement["subject"]}
    assert digests == {
        "candidate-adapter": hash_directory(ws.root / "dpo-v5" / "adapter"),
        "baseline-adapter": hash_directory(ws.root / "sft" / "adapter"),
    }
    predicate = statement["predicate"]
    assert predicate["candidate"]["id"] == "dpo-v5" and predicate["decision"] == "ready_for_evaluation"
    assert predicate["reason_codes"] == [] and predicate["checks"]["artifact"]["verified"] is True
    with sqlite3.connect(handed_off) as conn:
        decisive = conn.execute("SELECT seq, hash FROM events WHERE type = 'HandoffDecided'").fetchone()
        head = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    assert (predicate["decisive_event"]["seq"], predicate["decisive_event"]["hash"]) == decisive
    assert (predicate["ledger_head"]["seq"], predicate["ledger_head"]["hash"]) == head
    # Any DSSE implementation can check it: securesystemslib reads it back with the same PAE.
    assert Envelope.from_dict(doc).pae().startswith(b"DSSEv1 28 application/vnd.in-toto+json ")
    code, stdout, err = _check(out, keys)
    assert code == 0, err
    report = json.loads(stdout)
    assert report["ok"] is True and report["checked_against_ledger"] is False and report["candidate"] == "dpo-v5"
    code, stdout, err = _check(out, keys, "--db", str(handed_off))
    assert code == 0 and json.loads(stdout)["checked_against_ledger"] is True, err


def test_attest_needs_a_key_a_decision_and_a_new_file(ws: Workspace, handed_off: Path, keys: Path) -> None:
    out = ws.root / "a.json"
    result = cli(handed_off, "attest", "dpo-v5", "--out", str(out))
    assert result.returncode == 3 and "signing key" in result.stderr and not out.exists()
    assert _attest(handed_off, keys, "grpo-v7", out)[0] == 5 and not out.exists()  # received, not handed off
    assert _attest(handed_off, keys, "nobody", out)[0] == 4
    assert _attest(handed_off, keys, "dpo-v5", out)[0] == 0
    code, err = _attest(handed_off, keys, "dpo-v5", out)
    assert code == 3 and "already exists" in err


def test_a_decision_that_no_longer_stands_is_not_attested(ws: Workspace, handed_off: Path, keys: Path) -> None:
    """A baseline change sends the ready candidate back to received: its old hand-off is history, not a decision."""
    assert invoke(handed_off, "baseline", "activate", str(ws.baseline("sft2"))).exit_code == 0
    assert _attest(handed_off, keys, "dpo-v5", ws.root / "a.json")[0] == 5


@pytest.mark.parametrize("where", ["payload", "signature"])
def test_a_flipped_byte_is_refused(ws: Workspace, handed_off: Path, keys: Path, where: str) -> None:
    out = ws.root / "a.json"
    assert _attest(handed_off, keys, "dpo-v5", out)[0] == 0
    doc = json.loads(out.read_text())
    if where == "payload":
        raw = bytearray(base64.b64decode(doc["payload"]))
        raw[raw.index(b"ready_for_evaluation")] ^= 0x01  # one bit of the decision
        doc["payload"] = base64.b64encode(bytes(raw)).decode()
    else:
        sig = bytearray(base64.b64decode(doc["signatures"][0]["sig"]))
        sig[0] ^= 0x01
        doc["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    out.write_text(json.dumps(doc))
    code, stdout, err = _check(out, keys)
    assert code == 6 and err.startswith("Error: ") and "signature" in err and stdout == ""


def test_a_key_not_given_is_refused(ws: Workspace, handed_off: Path, keys: Path) -> None:
    out = ws.root / "a.json"
    assert _attest(handed_off, keys, "dpo-v5", out)[0] == 0
    other = ws.root / "other"
    assert invoke(handed_off, "key", "new", "--out", str(other)).exit_code == 0
    assert _check(out, other)[0] == 6


def test_not_an_envelope_is_an_input_error(ws: Workspace, keys: Path) -> None:
    bad = ws.root / "bad.json"
    bad.write_text('{"hello": 1}')
    assert _check(bad, keys)[0] == 3
    bad.write_text("not json {")
    assert _check(bad, keys)[0] == 3


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(payload=None),
        lambda d: d.update(payload=5),
        lambda d: d["signatures"][0].update(sig=5),
        lambda d: d["signatures"][0].update(keyid=5),
        lambda d: d.update(signatures=[5]),
        lambda d: d.update(signatures="x"),
    ],
    ids=["payload-null", "payload-number", "sig-number", "keyid-number", "signature-number", "signatures-text"],
)
def test_an_envelope_field_of_the_wrong_type_is_an_input_error(
    ws: Workspace, handed_off: Path, keys: Path, edit: object
) -> None:
    """`attest verify` of an envelope whose payload or signature was not a string (null, a number) died with
    "AttributeError: 'NoneType' / 'int' object has no attribute 'encode'" (exit 1). It is not a DSSE envelope:
    exit 3, one line naming the file."""
    out = ws.root / "a.json"
    assert _attest(handed_off, keys, "dpo-v5", out)[0] == 0
    doc = json.loads(out.read_text())
    edit(doc)  # type: ignore[operator]
    out.write_text(json.dumps(doc))
    code, stdout, err = _check(out, keys, "--db", str(handed_off))
    assert (code, stdout) == (3, ""), err
    assert err.startswith(f"Error: {out}: not a DSSE envelope") and err.count("\n") == 1, err


def test_an_edited_decisive_event_is_caught_against_the_ledger(ws: Workspace, handed_off: Path, keys: Path) -> None:
    out = ws.root / "a.json"
    assert _attest(handed_off, keys, "dpo-v5", out)[0] == 0
    with sqlite3.connect(handed_off, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute(
            "UPDATE events SET payload = replace(payload, 'ready_for_evaluation', 'tune') WHERE type = 'HandoffDecided'"
        )
    assert _check(out, keys)[0] == 0  # offline, the envelope itself is intact
    code, _, err = _check(out, keys, "--db", str(handed_off))
    assert code == 6 and err.startswith("Error: ")


@pytest.mark.parametrize("edited", ["head", "between"])
def test_an_edited_row_up_to_the_head_is_never_attested(
    ws: Workspace, handed_off: Path, keys: Path, edited: str
) -> None:
    """attest signs `ledger_head`: an edited head row, or one between the decision and the head, would give
    an envelope its own `attest verify --db` refuses. Refused here too: exit 6 naming the seq, no file."""
    with sqlite3.connect(handed_off) as conn:
        (head,) = conn.execute("SELECT max(seq) FROM events").fetchone()
    assert invoke(handed_off, "window", "2").exit_code == 0
    seq = head + 1 if edited == "head" else head
    with sqlite3.connect(handed_off, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute(f"UPDATE events SET actor = 'mallory' WHERE seq = {seq}")
    out = ws.root / "a.json"
    code, err = _attest(handed_off, keys, "dpo-v5", out)
    assert code == 6 and f"seq {seq}" in err and err.count("\n") == 1 and not out.exists(), err


def test_a_rehashed_ledger_does_not_hold_the_attested_events(ws: Workspace, handed_off: Path, keys: Path) -> None:
    """The writer edits the decision and re-hashes the whole chain: the attested hashes are gone."""
    out = ws.root / "a.json"
    assert _attest(handed_off, keys, "dpo-v5", out)[0] == 0
    with sqlite3.connect(handed_off, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute(
            "UPDATE events SET payload = replace(payload, 'ready_for_evaluation', 'tune') WHERE type = 'HandoffDecided'"
        )
        cols = "seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor"
        prev = GENESIS_HASH
        for row in conn.execute(f"SELECT {cols} FROM events ORDER BY seq").fetchall():
            digest = event_hash(prev_hash=prev, **dict(zip(cols.split(", "), row, strict=True)))
            conn.execute("UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, digest, row[0]))
            prev = digest
    code, _, err = _check(out, keys, "--db", str(handed_off))
    assert code == 6 and "not in this ledger's chain" in err


def test_another_ledger_does_not_hold_the_attestation(ws: Workspace, handed_off: Path, keys: Path) -> None:
    """Exit 6, and the refusal is a sentence naming the event by seq and hash (no Python dict printed)."""
    out = ws.root / "a.json"
    assert _attest(handed_off, keys, "dpo-v5", out)[0] == 0
    other = ws.root / "other.db"
    assert invoke(other, "init").exit_code == 0
    code, _, err = _check(out, keys, "--db", str(other))
    assert code == 6 and "{" not in err
    assert re.search(r"the attested decisive event, seq \d+ \(hash [0-9a-f]{64}\), is not in this ledger's chain", err)
    assert _check(out, keys, "--db", str(ws.root / "missing.db"))[0] == 3


def test_attest_out_dash_prints_the_envelope(ws: Workspace, handed_off: Path, keys: Path) -> None:
    """`--out -` wrote a file named `-` in the working folder; it prints the envelope (what `attest verify`
    takes), no file is made, and with --json (a second document on the same stdout) it is a usage error."""
    key = str(keys / "lifecycle-signing.key")
    result = cli(handed_off, "--signing-key", key, "attest", "dpo-v5", "--out", "-", cwd=ws.root)
    assert result.returncode == 0, result.stderr
    assert not (ws.root / "-").exists()
    printed = ws.root / "printed.intoto.json"
    printed.write_text(result.stdout)
    code, out, err = _check(printed, keys, "--db", str(handed_off))
    assert code == 0, err
    assert json.loads(out)["candidate"] == "dpo-v5"
    both = cli(handed_off, "--signing-key", key, "attest", "dpo-v5", "--out", "-", "--json", cwd=ws.root)
    assert both.returncode == 2 and "--json has nothing to add" in both.stderr and both.stdout == ""
