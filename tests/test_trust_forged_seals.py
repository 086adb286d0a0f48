"""Seals written by someone with file access and no key: each one fails `verify` closed.

A forged `HeadSealed` is appended through the store itself, so it is properly chained:
only the seal's own claims can give it away. A seal must seal the head right before
it; one missing a field is malformed, never a crash.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from conftest import Workspace, cli, invoke

from lifecycle_fsm.events import SEALS_STREAM, HeadSealed
from lifecycle_fsm.store.records import NewEvent
from lifecycle_fsm.store.sqlite import SQLiteEventStore
from lifecycle_fsm.upcasting import decoded_payload


def _sealed_ledger(ws: Workspace, keys: Path) -> Path:
    for args in (("init",), ("baseline", "activate", str(ws.baseline())), ("receive", str(ws.dpo()))):
        assert invoke(ws.db, *args).exit_code == 0, args
    result = cli(ws.db, "--signing-key", str(keys / "lifecycle-signing.key"), "seal")
    assert result.returncode == 0, result.stderr
    return ws.db


def _append_seal_payload(db: Path, payload: dict[str, object]) -> int:
    """Append `payload` as a chained HeadSealed, as a file writer using the library could."""
    with SQLiteEventStore(db) as store:
        event = NewEvent(
            stream_id=SEALS_STREAM,
            type=HeadSealed.TYPE,
            schema_version=HeadSealed.SCHEMA_VERSION,
            payload=payload,
            event_id=str(uuid.uuid4()),
            recorded_at="2026-01-01T00:00:00.000000Z",
            actor="intruder",
        )
        return store.append(SEALS_STREAM, store.stream_version(SEALS_STREAM), [event], fresh_ids=True).events[0].seq


def _first_seal(db: Path) -> dict[str, object]:
    with SQLiteEventStore(db) as store:
        return dict(decoded_payload(store.read_stream(SEALS_STREAM)[0]))


def _verify(db: Path, *args: str) -> tuple[int, dict[str, object], str]:
    result = cli(db, "verify", "--json", *args)
    return result.returncode, json.loads(result.stdout or "{}"), result.stderr


@pytest.mark.parametrize("field", ["key_id", "signature", "ledger_id", "seq", "hash"])
def test_a_seal_missing_a_field_fails_verify_closed(ws: Workspace, keys: Path, field: str) -> None:
    db = _sealed_ledger(ws, keys)
    forged = {k: v for k, v in _first_seal(db).items() if k != field}
    forged_seq = _append_seal_payload(db, forged)
    for args in ((), ("--pubkey", str(keys / "lifecycle-signing.pub"))):
        code, report, stderr = _verify(db, *args)
        assert code == 6, (args, stderr)
        assert "Traceback" not in stderr
        assert report["reason"] in ("seal_mismatch", "seal_signature") and report["bad_seq"] == forged_seq
        assert field in str(report["message"])


def test_a_replayed_old_seal_is_reported(ws: Workspace, keys: Path) -> None:
    """An old seal, signature and all, appended again after more events does not seal the head before it."""
    db = _sealed_ledger(ws, keys)
    assert invoke(db, "check", "dpo-v5").exit_code == 0
    forged_seq = _append_seal_payload(db, _first_seal(db))
    code, report, _ = _verify(db, "--pubkey", str(keys / "lifecycle-signing.pub"))
    assert code == 6 and report["reason"] == "seal_mismatch" and report["bad_seq"] == forged_seq
    assert f"seq {forged_seq - 1}" in str(report["message"])
    text = cli(db, "verify", "--pubkey", str(keys / "lifecycle-signing.pub"))
    assert text.returncode == 6 and "signatures checked" not in text.stdout


def test_verify_says_how_many_signatures_it_checked(ws: Workspace, keys: Path) -> None:
    db = _sealed_ledger(ws, keys)
    plain = cli(db, "verify")
    assert plain.returncode == 0 and "signatures not checked (no --pubkey)" in plain.stdout
    checked = cli(db, "verify", "--pubkey", str(keys / "lifecycle-signing.pub"))
    assert checked.returncode == 0 and "1 signature checked" in checked.stdout, checked.stdout
