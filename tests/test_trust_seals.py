"""Keys, ledger ids, seals and pinned heads (SPEC §8): the attacks of issue #9, each caught.

Each attack is made the way a file writer would make it (plain sqlite3, triggers
dropped, the chain re-hashed with the formula README documents) and first shown to
pass a plain `verify`, so the test proves what the trust features add.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import stat
from pathlib import Path

import pytest
from conftest import Workspace, cli, count_events, hand_off_dpo, invoke, restore_triggers, run_cli
from cryptography.hazmat.primitives import serialization

from lifecycle_fsm import Ledger
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.seals import ledger_id_of, parse_expected_head
from lifecycle_fsm.store.base import event_at
from lifecycle_fsm.store.chain import GENESIS_HASH, event_hash
from lifecycle_fsm.store.records import NewEvent
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.upcasting import decoded_payload, derived_ledger_id, upcast


def _ready_ledger(ws: Workspace) -> Path:
    return hand_off_dpo(ws)


def _signed(db: Path, key_dir: Path, *args: str) -> tuple[int, str, str]:
    result = cli(db, "--signing-key", str(key_dir / "lifecycle-signing.key"), *args)
    return result.returncode, result.stdout, result.stderr


def _verify(db: Path, *args: str) -> tuple[int, dict[str, object]]:
    result = cli(db, "verify", "--json", *args)
    return result.returncode, json.loads(result.stdout)


def _drop_triggers(conn: sqlite3.Connection) -> None:
    for trigger in ("events_refuse_update", "events_refuse_delete", "events_refuse_replace"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")


def _rehash_everything(db: Path, *edits: str) -> None:
    """The issue's attack: edit a row, then re-hash the whole chain and the checkpoints' head hashes."""
    with sqlite3.connect(db, isolation_level=None) as conn:
        _drop_triggers(conn)
        for sql in edits:
            conn.execute(sql)
        cols = "seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor"
        prev = GENESIS_HASH
        for row in conn.execute(f"SELECT {cols} FROM events ORDER BY seq").fetchall():
            names = cols.split(", ")
            fields = dict(zip(names, row, strict=True))
            digest = event_hash(prev_hash=prev, **fields)
            conn.execute("UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, digest, fields["seq"]))
            prev = digest
        conn.execute("UPDATE checkpoints SET head_hash = (SELECT hash FROM events WHERE seq = position)")
        restore_triggers(conn)


# --- keys -------------------------------------------------------------------------------------


def test_key_new_writes_a_private_key_0600_and_a_public_key_and_prints_its_id(tmp_path: Path) -> None:
    result = cli(tmp_path / "x.db", "key", "new", "--out", str(tmp_path / "k" / "nested"), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    private, public = Path(doc["private_key"]), Path(doc["public_key"])
    assert private.name == "lifecycle-signing.key" and public.name == "lifecycle-signing.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8
    pub = serialization.load_pem_public_key(public.read_bytes())
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert doc["key_id"] == hashlib.sha256(raw).hexdigest()
    assert not (tmp_path / "x.db").exists()  # no ledger touched


def test_key_new_never_overwrites_a_key(keys: Path) -> None:
    before = (keys / "lifecycle-signing.key").read_bytes()
    result = cli(keys / "x.db", "key", "new", "--out", str(keys))
    assert result.returncode == 3 and "already exists" in result.stderr
    assert (keys / "lifecycle-signing.key").read_bytes() == before


def test_seal_without_a_key_is_refused_and_appends_nothing(ws: Workspace) -> None:
    db = _ready_ledger(ws)
    before = count_events(db)
    result = cli(db, "seal")
    assert result.returncode == 3 and "signing key" in result.stderr
    bad = ws.root / "bad.key"
    bad.write_text("not a key")
    assert cli(db, "--signing-key", str(bad), "seal").returncode == 3
    assert cli(db, "--signing-key", str(bad), "checkpoint").returncode == 3
    assert count_events(db) == before


def test_the_signing_key_comes_from_the_environment_too(ws: Workspace, keys: Path) -> None:
    db = _ready_ledger(ws)
    env = {"LIFECYCLE_SIGNING_KEY": str(keys / "lifecycle-signing.key")}
    result = cli(db, "seal", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) == {"ledger_id", "seq", "hash", "sealed_at", "key_id", "signature"}


# --- ledger ids ---------------------------------------------------------------------------------


def test_init_gives_each_ledger_a_random_id_that_never_changes(tmp_path: Path) -> None:
    ids = []
    for name in ("a.db", "b.db"):
        assert invoke(tmp_path / name, "init").exit_code == 0
        with SQLiteEventStore(tmp_path / name) as store:
            ids.append(ledger_id_of(store))
            assert decoded_payload(event_at(store, 1))["ledger_id"] == ids[-1]  # type: ignore[arg-type]
    assert ids[0] != ids[1] and all(isinstance(i, str) and len(i) == 32 for i in ids)
    assert invoke(tmp_path / "a.db", "window", "2").exit_code == 0
    with SQLiteEventStore(tmp_path / "a.db") as store:
        assert ledger_id_of(store) == ids[0]


def _ledger_without_id(ws: Workspace) -> Path:
    """A ledger whose first event is a `LedgerInitialized` at schema version 1 (no `ledger_id` field),
    then a baseline and two decided candidates, written through the store as a writer of that version did."""
    with SQLiteEventStore(ws.db) as store:
        store.append(
            "ledger",
            0,
            [
                NewEvent(
                    "ledger",
                    "LedgerInitialized",
                    1,
                    {"max_window_age": 2, "active_window": 1},
                    "first",
                    "2026-01-01T00:00:00.000000Z",
                    "old-writer",
                )
            ],
        )
    for args in (
        ("baseline", "activate", str(ws.baseline())),
        ("receive", str(ws.dpo())),
        ("check", "dpo-v5"),
        ("handoff", "dpo-v5"),
        ("receive", str(ws.grpo(evidence_window_index=None))),
        ("check", "grpo-v7"),
    ):
        assert invoke(ws.db, *args).exit_code == 0, args
    return ws.db


def test_a_ledger_without_an_id_gets_one_from_its_first_event(ws: Workspace) -> None:
    """The upcaster LedgerInitialized v1 -> v2 derives the id from the stored hash, the same on every read."""
    db = _ledger_without_id(ws)
    with SQLiteEventStore(db, create=False) as store:
        first = event_at(store, 1)
        assert first is not None and first.type == "LedgerInitialized" and first.schema_version == 1
        derived = derived_ledger_id(first.hash)
        assert ledger_id_of(store) == derived
        assert decoded_payload(first)["ledger_id"] == derived
        head = store.head()
    code, report = _verify(db)  # every read derives the same id; reading never rewrote the stored row
    assert code == 0 and report["head"] == {"seq": head.seq, "hash": head.hash}
    status = json.loads(cli(db, "status", "--json").stdout)
    assert [(c["id"], c["state"]) for c in status] == [("dpo-v5", "ready"), ("grpo-v7", "reject")]
    with SQLiteEventStore(db) as store:
        assert ledger_id_of(store) == derived
        assert event_at(store, 1).schema_version == 1  # type: ignore[union-attr]


def test_the_upcaster_without_a_stored_hash_adds_none(tmp_path: Path) -> None:
    """The fold passes no hash (it never reads the id): None, and the input is not mutated."""
    payload = {"max_window_age": 2, "active_window": 1}
    assert upcast("LedgerInitialized", 1, payload) == {**payload, "ledger_id": None}
    assert payload == {"max_window_age": 2, "active_window": 1}
    assert upcast("LedgerInitialized", 1, payload, event_hash="ab" * 32)["ledger_id"] == derived_ledger_id("ab" * 32)


def test_a_ledger_without_an_id_can_be_sealed_and_verified(ws: Workspace, keys: Path) -> None:
    db = _ledger_without_id(ws)
    head = json.loads(cli(db, "verify", "--json").stdout)["head"]
    code, out, err = _signed(db, keys, "seal", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["seq"], doc["hash"]) == (head["seq"], head["hash"])
    pin = f"{head['seq']}:{head['hash']}"
    code, report = _verify(db, "--pubkey", str(keys / "lifecycle-signing.pub"), "--expect-head", pin)
    assert code == 0, report
    assert report["seals"] == {"count": 1, "keys": [doc["key_id"]], "last_seq": head["seq"] + 1}


# --- seals and pinned heads -----------------------------------------------------------------------


def test_a_seal_decides_nothing_and_keeps_the_index_true(ws: Workspace, keys: Path) -> None:
    db = _ready_ledger(ws)
    status = cli(db, "status", "--json").stdout
    code, out, _ = _signed(db, keys, "seal", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["seq"] == count_events(db) - 1
    assert cli(db, "status", "--json").stdout == status
    code, report = _verify(db)
    assert code == 0 and report["seals"]["count"] == 1 and report["seals"]["last_seq"] == doc["seq"] + 1
    history = json.loads(cli(db, "log", "--stream", "seals", "--json").stdout)
    assert [e["type"] for e in history] == ["HeadSealed"]


def test_seal_out_writes_the_signed_head_file_once(ws: Workspace, keys: Path) -> None:
    db = _ready_ledger(ws)
    out = ws.root / "head.json"
    code, _, err = _signed(db, keys, "seal", "--out", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT hash FROM events WHERE seq = 5").fetchone() == (doc["hash"],)
    assert doc["seq"] == 5 and stat.S_IMODE(out.stat().st_mode) & 0o077 in (0, 0o044)
    before = count_events(db)
    code, _, err = _signed(db, keys, "seal", "--out", str(out))
    assert code == 3 and "already exists" in err and count_events(db) == before


def test_seal_or_attest_out_naming_a_folder_is_refused_before_anything_is_written(ws: Workspace, keys: Path) -> None:
    """`--out sealdir/` meant a folder: refused (usage, exit 2), never a file named `sealdir`, no seal appended."""
    db = _ready_ledger(ws)
    before = count_events(db)
    for command in (["seal"], ["attest", "create", "dpo-v5"]):
        for folder in ("out/", "out/.", "out/.."):
            code, _, err = _signed(db, keys, *command, "--out", f"{ws.root}/{folder}")
            assert code == 2 and "names a folder: give the file's name" in err, err
    assert not (ws.root / "out").exists() and count_events(db) == before


def test_seal_out_dash_prints_the_signed_head(ws: Workspace, keys: Path) -> None:
    """`--out -` wrote a file named `-`; it prints the signed head, as `seal` without `--out` does."""
    db = _ready_ledger(ws)
    result = cli(db, "--signing-key", str(keys / "lifecycle-signing.key"), "seal", "--out", "-", cwd=ws.root)
    assert result.returncode == 0, result.stderr
    assert not (ws.root / "-").exists()
    assert json.loads(result.stdout)["seq"] == 5


def test_seal_out_to_a_path_it_cannot_write_appends_nothing(ws: Workspace, keys: Path) -> None:
    """The output file is claimed before the seal is appended: a missing folder is exit 3, no HeadSealed."""
    db = _ready_ledger(ws)
    before = count_events(db)
    code, _, err = _signed(db, keys, "seal", "--out", str(ws.root / "missing" / "head.json"))
    assert code == 3 and "nothing was sealed" in err and err.count("\n") == 1
    assert count_events(db) == before


def test_a_dropped_tail_passes_plain_verify_but_not_a_pinned_head(ws: Workspace, keys: Path) -> None:
    db = _ready_ledger(ws)
    head_file = ws.root / "head.json"
    assert _signed(db, keys, "seal", "--out", str(head_file))[0] == 0
    pinned = json.loads(head_file.read_text())
    with sqlite3.connect(db, isolation_level=None) as conn:
        _drop_triggers(conn)
        conn.execute("DELETE FROM events WHERE seq >= ?", (pinned["seq"] - 1,))  # the hand-off and the seal
        conn.execute("DELETE FROM streams")
        restore_triggers(conn)
    assert cli(db, "replay", "--full").returncode == 0  # the attacker tidies the index too
    code, report = _verify(db)
    assert code == 0 and report["ok"] is True  # the attack works without a pin...
    for pin in (str(head_file), f"{pinned['seq']}:{pinned['hash']}"):
        code, report = _verify(db, "--expect-head", pin)
        assert code == 6 and report["reason"] == "head_mismatch" and report["bad_seq"] == pinned["seq"]


def test_a_rehashed_chain_passes_plain_verify_but_not_a_seal(ws: Workspace, keys: Path) -> None:
    db = _ready_ledger(ws)
    assert _signed(db, keys, "checkpoint")[0] == 0  # a checkpoint with a key seals too
    head_file = ws.root / "head.json"
    assert _signed(db, keys, "seal", "--out", str(head_file))[0] == 0
    _rehash_everything(
        db,
        "UPDATE events SET payload = replace(payload, '\"eval-v1\"', '\"eval-vX\"') WHERE seq = 3",
        "DELETE FROM checkpoint_streams",  # the snapshots hold the old evaluation version: gone too
        "DELETE FROM checkpoints",
    )
    code, report = _verify(db)
    assert report["reason"] == "seal_mismatch"  # the seals' hashes no longer match the chain
    pub = str(keys / "lifecycle-signing.pub")
    # The attacker also rewrites each seal's hash to the new chain and re-hashes again.
    with sqlite3.connect(db, isolation_level=None) as conn:
        seals = conn.execute("SELECT seq, payload FROM events WHERE type = 'HeadSealed' ORDER BY seq").fetchall()
    for seq, payload in seals:
        sealed = json.loads(payload)["seq"]
        with sqlite3.connect(db) as conn:
            (new_hash,) = conn.execute("SELECT hash FROM events WHERE seq = ?", (sealed,)).fetchone()
        text = json.loads(payload) | {"hash": new_hash}
        canonical = json.dumps(text, separators=(",", ":"), sort_keys=True)
        _rehash_everything(db, f"UPDATE events SET payload = '{canonical}' WHERE seq = {seq}")
    code, report = _verify(db)
    assert code == 0 and report["ok"] is True  # without a key, a forged chain with forged seals verifies
    code, report = _verify(db, "--pubkey", pub)
    assert code == 6 and report["reason"] == "seal_signature" and report["bad_seq"] == seals[0][0]
    code, report = _verify(db, "--expect-head", str(head_file))
    assert code == 6 and report["reason"] == "head_mismatch"


@pytest.mark.parametrize("time", ["not a time", "", "2026-12-07T16:06:00Z"])
def test_a_rehashed_row_whose_time_is_not_in_the_ledgers_form_fails_verify(ws: Workspace, time: str) -> None:
    """`--as-of` compares stored times as text: a row no writer could store (its chain re-hashed) is named."""
    db = _ready_ledger(ws)
    _rehash_everything(db, f"UPDATE events SET recorded_at = '{time}' WHERE seq = 3")
    for jobs in (["--jobs", "1"], ["--jobs", "2"]):
        code, report = _verify(db, *jobs)
        assert code == 6 and report["bad_seq"] == 3 and "recorded_at" in str(report["reason"]), (jobs, report)


@pytest.mark.parametrize("command", ["seal", "checkpoint"])
def test_a_chain_rewritten_under_a_seal_of_this_key_is_never_sealed_again(
    ws: Workspace, keys: Path, command: str
) -> None:
    """A rewritten, re-hashed chain is consistent with itself; a seal this key signed names the head it had.
    That seal no longer holds, and it is no row anyone could add: nothing is sealed, exit 6."""
    db = _ready_ledger(ws)
    assert _signed(db, keys, "seal")[0] == 0
    assert cli(db, "window", "2").returncode == 0
    _rehash_everything(
        db,
        "UPDATE events SET payload = replace(payload, '\"eval-v1\"', '\"eval-vX\"') WHERE seq = 3",
        "DELETE FROM checkpoint_streams",
        "DELETE FROM checkpoints",
    )
    events = count_events(db)
    code, _, stderr = _signed(db, keys, command)
    assert code == 6 and "this key sealed head" in stderr and "nothing sealed" in stderr, stderr
    assert stderr.count("\n") == 1 and count_events(db) == events
    with sqlite3.connect(db) as conn:  # a checkpoint with a key is refused whole: no snapshot of the rewrite
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == (0,)


def test_a_seal_under_a_key_not_given_is_refused(ws: Workspace, keys: Path, tmp_path: Path) -> None:
    db = _ready_ledger(ws)
    assert _signed(db, keys, "seal")[0] == 0
    other = tmp_path / "other"
    assert invoke(db, "key", "new", "--out", str(other)).exit_code == 0
    code, report = _verify(db, "--pubkey", str(other / "lifecycle-signing.pub"))
    assert code == 6 and report["reason"] == "seal_signature" and report["bad_seq"] == count_events(db)
    code, report = _verify(
        db, "--pubkey", str(other / "lifecycle-signing.pub"), "--pubkey", str(keys / "lifecycle-signing.pub")
    )
    assert code == 0 and report["seals"]["count"] == 1


def test_a_signed_head_file_from_another_key_is_refused(ws: Workspace, keys: Path, tmp_path: Path) -> None:
    db = _ready_ledger(ws)
    head_file = ws.root / "head.json"
    assert _signed(db, keys, "seal", "--out", str(head_file))[0] == 0
    code, report = _verify(db, "--expect-head", str(head_file), "--pubkey", str(keys / "lifecycle-signing.pub"))
    assert code == 0 and report["ok"] is True, report  # as it was signed: it holds
    forged = json.loads(head_file.read_text())
    forged["signature"] = forged["signature"][:-4] + ("AAA=" if not forged["signature"].endswith("AAA=") else "BBB=")
    head_file.write_text(json.dumps(forged))
    code, report = _verify(db, "--expect-head", str(head_file), "--pubkey", str(keys / "lifecycle-signing.pub"))
    assert code == 6 and report["reason"] == "seal_signature"


@pytest.mark.parametrize("pin", ["nonsense", "5:abc"])
def test_a_bad_expect_head_is_an_input_error(ws: Workspace, pin: str) -> None:
    db = _ready_ledger(ws)
    result = cli(db, "verify", "--expect-head", pin)
    assert result.returncode == 3 and result.stderr.startswith("Error: ")


def _head(db: Path) -> tuple[int, str]:
    code, report = _verify(db)
    head = report["head"]
    assert code == 0 and isinstance(head, dict)
    return int(head["seq"]), str(head["hash"])


HASH = "ab" * 32


@pytest.mark.parametrize(
    ("pin", "problem"),
    [
        (f"7:{HASH.upper()}", "the hash is not 64 lowercase hex digits (it is in upper case)"),
        ("7:deadbeef", "the hash is not 64 lowercase hex digits (it has 8 hex digits)"),
        ("7:", "the hash is not 64 lowercase hex digits (it is empty)"),
        (f"7:{HASH}0", "the hash is not 64 lowercase hex digits (it has 65 hex digits)"),
        (f"7:{HASH[:-1]}g", "the hash is not 64 lowercase hex digits (it has a character that is not a hex digit)"),
        (f"0:{GENESIS_HASH}", "seq 0 is not an event (the chain starts at seq 1)"),
        (f"0:{HASH}", "seq 0 is not an event (the chain starts at seq 1)"),
        (f"-1:{HASH}", "the seq '-1' is not a whole number from 1"),
        (f"x:{HASH}", "the seq 'x' is not a whole number from 1"),
        (f"99999999999999999999:{HASH}", "no seq is that large"),  # was a traceback (OverflowError in sqlite3)
        (f"9223372036854775808:{HASH}", "no seq is that large"),  # one past the largest SQLite integer
    ],
    ids=["upper", "short", "empty", "long", "not-hex", "genesis", "zero", "negative", "word", "huge", "int64"],
)
def test_a_malformed_pin_says_what_is_wrong_with_it(pin: str, problem: str) -> None:
    """A value of SEQ:HASH's shape whose hash is not 64 lowercase hex, or whose seq is not a whole number
    from 1, is refused naming that, not as a missing file; `0:<genesis>` pinned no event and passed."""
    with pytest.raises(InputError) as refused:
        parse_expected_head(pin)
    assert str(refused.value) == f"--expect-head {pin!r}: {problem}; give SEQ:HASH as `verify --json` prints the head"


@pytest.mark.parametrize("seq", [9223372036854775807, 1000000000000000000, 1])
def test_a_pin_of_any_seq_a_ledger_can_hold_is_read(seq: int) -> None:
    pin = parse_expected_head(f"{seq}:{HASH}")
    assert (pin.seq, pin.hash) == (seq, HASH)


def test_a_pin_past_the_head_names_no_event_there(ws: Workspace) -> None:
    db = _ready_ledger(ws)
    code, report = _verify(db, "--expect-head", f"99:{HASH}")
    assert code == 6 and report["reason"] == "head_mismatch"
    assert f"expected head 99:{HASH}" in str(report["message"]) and "the ledger has no event there" in str(report)
    assert f"({99}:{HASH})" not in str(report["message"])  # the pin is said once


def test_a_signed_head_of_another_ledger_is_named_as_such(ws: Workspace, keys: Path, tmp_path: Path) -> None:
    """Pinning the head another ledger sealed: the message says whose it is, not only which hash differs."""
    db = _ready_ledger(ws)
    other = Workspace(tmp_path / "other")
    other_db = hand_off_dpo(other)
    out = tmp_path / "other-head.json"
    assert _signed(other_db, keys, "seal", "--out", str(out))[0] == 0
    code, report = _verify(db, "--expect-head", str(out))
    with SQLiteEventStore(str(db), create=False) as store:
        ids = (json.loads(out.read_text())["ledger_id"], ledger_id_of(store))
    assert code == 6 and report["reason"] == "head_mismatch"
    assert f"is a head of another ledger (ledger id {ids[0]}; this one's is {ids[1]})" in str(report["message"])


def test_a_malformed_pin_is_one_error_line_and_exit_3(ws: Workspace) -> None:
    """Through a real process: exit 3, nothing on stdout, the refusal on stderr."""
    db = _ready_ledger(ws)
    result = run_cli(db, "verify", "--expect-head", "7:deadbeef")
    assert (result.returncode, result.stdout) == (3, "")
    assert result.stderr.startswith("Error: --expect-head '7:deadbeef': the hash is not 64 lowercase hex digits")


def test_a_pin_with_leading_zeros_is_its_seq(ws: Workspace) -> None:
    """`0…07:HASH` is seq 7, however many zeros (int() alone refuses 4300+ digits: a traceback)."""
    db = _ready_ledger(ws)
    seq, digest = _head(db)
    code, report = _verify(db, "--expect-head", f"{'0' * 5000}{seq}:{digest}")
    assert code == 0 and report["ok"] is True


def test_a_pin_shaped_file_is_still_a_file_and_a_file_pins_a_seq_from_1(ws: Workspace, keys: Path) -> None:
    """A signed-head file whose name looks like a bad pin is read as the file; a file pinning seq 0 is refused."""
    db = _ready_ledger(ws)
    assert _signed(db, keys, "seal", "--out", str(ws.root / "7:abc"))[0] == 0
    result = cli(db, "verify", "--json", "--expect-head", "7:abc", cwd=ws.root)
    assert result.returncode == 0, result.stderr
    doc = json.loads((ws.root / "7:abc").read_text()) | {"seq": 0, "hash": GENESIS_HASH}
    (ws.root / "genesis.json").write_text(json.dumps(doc))
    result = cli(db, "verify", "--expect-head", str(ws.root / "genesis.json"))
    assert (result.returncode, result.stdout) == (3, "")
    assert "needs an integer `seq` from 1 and a `hash` of 64 lowercase hex digits" in result.stderr


def test_sealing_an_empty_ledger_is_refused(ws: Workspace, keys: Path) -> None:
    assert invoke(ws.db, "init").exit_code == 0
    with sqlite3.connect(ws.db) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    empty = ws.root / "empty.db"
    SQLiteEventStore(empty).close()
    code, _, err = _signed(empty, keys, "seal")
    assert code == 5 and "empty" in err


def test_a_seal_signs_exactly_these_bytes() -> None:
    """The signed message is pinned byte for byte: the ledger id is in it (a seal cannot be moved to another
    ledger), keys sorted, no spaces; anyone can rebuild it with the standard library."""
    from lifecycle_fsm.seals import seal_message

    message = seal_message("0123abcd" * 4, 42, "ab" * 32)
    assert message == (b'{"hash":"' + b"ab" * 32 + b'","ledger_id":"0123abcd0123abcd0123abcd0123abcd","seq":42}')
    assert (
        message
        == json.dumps(
            {"ledger_id": "0123abcd" * 4, "seq": 42, "hash": "ab" * 32}, sort_keys=True, separators=(",", ":")
        ).encode()
    )


def test_a_keyed_seal_retried_answers_what_it_signed_and_appends_nothing(ws: Workspace, keys: Path) -> None:
    """`seal --event-id K` again (a retry) prints the head it signed the first time, even once the head moved;
    with `--out`, a file holding that signed head answers it; a key another command used is refused."""
    db = _ready_ledger(ws)
    code, first, _ = _signed(db, keys, "seal", "--event-id", "nightly-1", "--json")
    assert code == 0
    events = count_events(db)
    moved = run_cli(db, "evaluation", "activate", "eval-v9", "--event-id", "moves-on")
    assert moved.returncode == 0, moved.stderr  # the head moves on
    events = count_events(db)
    code, again, _ = _signed(db, keys, "seal", "--event-id", "nightly-1", "--json")
    assert (code, json.loads(again), count_events(db)) == (0, json.loads(first), events)
    code, _, err = _signed(db, keys, "seal", "--event-id", "moves-on")
    assert (code, count_events(db)) == (5, events) and "already used" in err  # as for any command
    code, _, err = _signed(db, keys, "seal", "--event-id", "nightly/2")
    assert (code, count_events(db)) == (3, events) and "ends with '/<number>'" in err  # every key's rule

    out = ws.root / "head.json"
    assert _signed(db, keys, "seal", "--event-id", "nightly-2", "--out", str(out))[0] == 0
    written, events = out.read_bytes(), count_events(db)
    code, text, _ = _signed(db, keys, "seal", "--event-id", "nightly-2", "--out", str(out))
    assert (code, out.read_bytes(), count_events(db)) == (0, written, events) and str(out) in text
    other = ws.root / "other.json"  # missing (its first run stopped before writing it): written now
    assert _signed(db, keys, "seal", "--event-id", "nightly-2", "--out", str(other))[0] == 0
    assert (other.read_bytes(), count_events(db)) == (written, events)
    other.write_text("{}")
    code, _, err = _signed(db, keys, "seal", "--event-id", "nightly-2", "--out", str(other))
    assert code == 3 and "does not hold its signed head" in err and other.read_text() == "{}"
    with Ledger.open(db, signing_key=str(keys / "lifecycle-signing.key")) as ledger:
        assert ledger.seal(event_id="nightly-1") == json.loads(first)
    assert count_events(db) == events


def test_two_retries_of_one_keyed_seal_at_once_both_answer_the_seal_that_landed(tmp_path: Path) -> None:
    """The second found the key free before the first committed (it held the lock writing its file): it
    answers with the first one's signed head, not a DuplicateEventError."""
    import threading
    import time

    from lifecycle_fsm.keys import load_private_key, new_key_pair
    from lifecycle_fsm.manifests import utc_now
    from lifecycle_fsm.seals import seal

    new_key_pair(tmp_path / "keys")
    key = load_private_key(tmp_path / "keys" / "lifecycle-signing.key")
    db = tmp_path / "l.db"
    Ledger.open(db).init()
    out: dict[str, object] = {}

    def run(name: str, hold: float) -> None:
        with Ledger.open(db) as ledger:
            try:
                out[name] = seal(
                    ledger.store, key, actor="a", clock=utc_now, event_id="k1", before_commit=lambda _: time.sleep(hold)
                )
            except Exception as e:  # the test judges it
                out[name] = e

    first = threading.Thread(target=run, args=("first", 1.0))
    first.start()
    time.sleep(0.3)
    run("second", 0)
    first.join()
    assert isinstance(out["first"], dict) and out["second"] == out["first"]
    assert count_events(db) == 2


def test_a_pinned_head_is_parsed_from_seq_hash_or_a_signed_head_file(tmp_path: Path) -> None:
    digest = "ab" * 32
    for text in (f"42:{digest}", f"0042:{digest}", f" 42:{digest} "):
        pin = parse_expected_head(text)
        assert (pin.seq, pin.hash, pin.source, pin.signed) == (42, digest, text, None)
    for text, why in [("not json {", "not JSON"), ("[1, 2]", "not an object")]:
        (tmp_path / "head.json").write_text(text)
        with pytest.raises(InputError, match=f"not a signed-head file \\({why}"):
            parse_expected_head(str(tmp_path / "head.json"))


def _edit_in_place(db: Path, sql: str) -> None:
    """An edit with the sqlite3 shell, nothing re-hashed, the triggers put back."""
    with sqlite3.connect(db, isolation_level=None) as conn:
        _drop_triggers(conn)
        conn.execute(sql)
        restore_triggers(conn)


def test_an_edit_before_a_pinned_head_and_a_seal_fails_them_both(ws: Workspace, keys: Path) -> None:
    """A row edited in place before them (not re-hashed): the stored hashes at the pin and at the sealed head
    are untouched, but the chain recomputed from the rows is not them: head_mismatch and seal_mismatch are
    among the problems, after the break (the first bad position, `bad_seq`)."""
    db = _ready_ledger(ws)
    code, signed, _ = _signed(db, keys, "seal", "--json")
    sealed = json.loads(signed)
    pin = f"{sealed['seq']}:{sealed['hash']}"
    _edit_in_place(db, "UPDATE events SET actor = 'mallory' WHERE seq = 2")
    code, doc = _verify(db, "--expect-head", pin, "--pubkey", str(keys / "lifecycle-signing.pub"))
    found = [(p["code"], p["bad_seq"]) for p in doc["problems"]]
    assert (
        code == 6 and found[0] == ("chain", 2) and (doc["bad_seq"], doc["reason"]) == (2, doc["problems"][0]["reason"])
    )
    assert ("head_mismatch", sealed["seq"]) in found and ("seal_mismatch", sealed["seq"] + 1) in found
    assert [p["bad_seq"] for p in doc["problems"] if p["bad_seq"] is not None] == sorted(
        p["bad_seq"] for p in doc["problems"] if p["bad_seq"] is not None
    )
    # A pin before the edit still holds: the rows up to it recompute to its hash; one at the edited row fails.
    code, doc = _verify(db, "--expect-head", f"1:{hash_at_seq(db, 1)}")
    assert "head_mismatch" not in [p["code"] for p in doc["problems"]]
    code, doc = _verify(db, "--expect-head", f"2:{hash_at_seq(db, 2)}")
    assert ("head_mismatch", 2) in [(p["code"], p["bad_seq"]) for p in doc["problems"]]


def test_problems_are_listed_first_bad_position_first(ws: Workspace, keys: Path) -> None:
    """A pinned head that fails at seq 3 and a seal row edited at a later seq: `bad_seq` is 3, the first."""
    db = _ready_ledger(ws)
    assert _signed(db, keys, "seal")[0] == 0
    seal_seq = count_events(db)
    _edit_in_place(db, f"UPDATE events SET actor = 'mallory' WHERE seq = {seal_seq}")
    code, doc = _verify(db, "--expect-head", "3:" + "d" * 64)
    seqs = [p["bad_seq"] for p in doc["problems"]]
    assert code == 6 and seqs[0] == 3 and doc["bad_seq"] == 3 and doc["problems"][0]["code"] == "head_mismatch"
    assert ("chain", seal_seq) in [(p["code"], p["bad_seq"]) for p in doc["problems"]]


def hash_at_seq(db: Path, seq: int) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()[0])


def test_a_sealed_head_edited_in_place_fails_its_seal(ws: Workspace, keys: Path) -> None:
    """The row the seal signed, edited without re-hashing: the chain breaks there and the seal right after it
    does not hold (its head is not the recomputed chain's)."""
    db = _ready_ledger(ws)
    sealed = json.loads(_signed(db, keys, "seal", "--json")[1])
    _edit_in_place(db, f"UPDATE events SET actor = 'mallory' WHERE seq = {sealed['seq']}")
    found = [(p["code"], p["bad_seq"]) for p in _verify(db)[1]["problems"]]
    assert found[:2] == [("chain", sealed["seq"]), ("seal_mismatch", sealed["seq"] + 1)]


def test_a_seal_whose_payload_is_not_json_fails_even_re_hashed(ws: Workspace, keys: Path) -> None:
    db = _ready_ledger(ws)
    assert _signed(db, keys, "seal")[0] == 0
    seal_seq = count_events(db)
    _rehash_everything(db, f"UPDATE events SET payload = 'not json' WHERE seq = {seal_seq}")
    code, doc = _verify(db)
    assert code == 6 and ("seal_mismatch", seal_seq) in [(p["code"], p["bad_seq"]) for p in doc["problems"]]


def test_a_keyed_seal_with_out_that_loses_the_race_writes_the_winners_head(ws: Workspace, keys: Path) -> None:
    """`seal --event-id K --out FILE` finds K free, then waits for the lock while another run of K seals: it
    answers with that seal's signed head, in FILE (it indexed a file it never staged: a traceback)."""
    import threading
    import time

    from lifecycle_fsm.keys import load_private_key
    from lifecycle_fsm.manifests import utc_now
    from lifecycle_fsm.seals import seal, signed_head_text

    db = _ready_ledger(ws)
    first: dict[str, object] = {}

    def hold() -> None:
        with Ledger.open(db) as ledger:
            key = load_private_key(keys / "lifecycle-signing.key")
            first.update(
                seal(ledger.store, key, actor="a", clock=utc_now, event_id="k", before_commit=lambda _: time.sleep(2))
            )

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.5)
    out = ws.root / "head.json"
    code, _, err = _signed(db, keys, "seal", "--event-id", "k", "--out", str(out))
    holder.join()
    assert code == 0, err
    assert out.read_text() == signed_head_text(first) and count_events(db) == first["seq"] + 1  # type: ignore[operator]


def test_a_row_time_out_of_form_breaks_the_chain_but_no_pin_or_seal(ws: Workspace, keys: Path) -> None:
    """Every hash still recomputes past a row whose time is not in the ledger's form: `verify` names that row,
    and a pinned head and a seal past it still hold (no false head_mismatch)."""
    db = _ready_ledger(ws)
    _rehash_everything(db, "UPDATE events SET recorded_at = '2026-12-07T20:22:40Z' WHERE seq = 2")
    out = ws.root / "head.json"
    assert _signed(db, keys, "seal", "--out", str(out))[0] == 0
    code, doc = _verify(db, "--expect-head", str(out), "--pubkey", str(keys / "lifecycle-signing.pub"))
    found = [(p["code"], p["bad_seq"]) for p in doc["problems"]]
    assert code == 6 and found == [("chain", 2)], found


def test_the_first_row_edited_in_place_is_reported_with_the_pins_and_seals_it_fails(ws: Workspace, keys: Path) -> None:
    """The ledger's id comes from its first row: edited, `verify --json` printed one error line, no report."""
    db = _ready_ledger(ws)
    sealed = json.loads(_signed(db, keys, "seal", "--json")[1])
    _edit_in_place(db, "UPDATE events SET actor = 'mallory' WHERE seq = 1")
    code, doc = _verify(db, "--expect-head", f"{sealed['seq']}:{sealed['hash']}")
    found = [(p["code"], p["bad_seq"]) for p in doc["problems"]]
    assert code == 6 and found[0] == ("chain", 1) and doc["bad_seq"] == 1
    assert {("head_mismatch", sealed["seq"]), ("seal_mismatch", sealed["seq"] + 1)} <= set(found)
