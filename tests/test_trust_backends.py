"""Seals, pinned heads and fail-closed reads on every backend (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from backends import Backend
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.keys import PublicKeys, key_id
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import index_of, load_state
from lifecycle_fsm.replay import verify as verify_ledger
from lifecycle_fsm.seals import add_trust_findings, ledger_id_of, parse_expected_head, seal
from lifecycle_fsm.store.base import EventStore

CLOCK = "2026-12-01T00:00:00.000000Z"


@pytest.fixture
def store(backend: Backend) -> Iterator[EventStore]:
    opened = backend.open()
    ledger = Ledger(opened, actor="test", clock=lambda: CLOCK)
    ledger.init()
    ledger.advance_window(2)
    ledger.advance_window(3)
    yield opened
    opened.close()


def _verify(store: EventStore, keys: PublicKeys, *pins: str) -> dict[str, object]:
    return add_trust_findings(store, verify_ledger(store), [parse_expected_head(p) for p in pins], keys)


def test_a_seal_verifies_on_every_backend(store: EventStore) -> None:
    key = Ed25519PrivateKey.generate()
    ledger_id = ledger_id_of(store)
    assert isinstance(ledger_id, str) and ledger_id_of(store) == ledger_id
    head = store.head()
    doc = seal(store, key, actor="auditor", clock=lambda: CLOCK)
    assert (doc["seq"], doc["hash"], doc["ledger_id"], doc["key_id"]) == (
        head.seq,
        head.hash,
        ledger_id,
        key_id(key.public_key()),
    )
    report = _verify(store, PublicKeys([key.public_key()]), f"{head.seq}:{head.hash}")
    assert report["ok"] is True, report
    assert report["seals"] == {"count": 1, "keys": [doc["key_id"]], "last_seq": head.seq + 1}
    other = Ed25519PrivateKey.generate().public_key()
    report = _verify(store, PublicKeys([other]))
    assert (report["ok"], report["reason"], report["bad_seq"]) == (False, "seal_signature", head.seq + 1)


def test_a_dropped_tail_misses_the_pinned_head_on_every_backend(backend: Backend, store: EventStore) -> None:
    head = store.head()
    store.rebuild_stream_index(lambda: index_of(load_state(store, use_checkpoints=False).state))  # to the head
    backend.delete(head.seq)
    assert _verify(store, PublicKeys())["reason"].startswith("state index")  # type: ignore[union-attr]
    store.rebuild_stream_index(lambda: index_of(load_state(store, use_checkpoints=False).state))  # tidied up
    assert _verify(store, PublicKeys())["ok"] is True  # the attack works without a pin
    report = _verify(store, PublicKeys(), f"{head.seq}:{head.hash}")
    assert (report["reason"], report["bad_seq"]) == ("head_mismatch", head.seq)


def test_a_row_edited_in_place_is_refused_by_a_checked_fold(backend: Backend, store: EventStore) -> None:
    backend.tamper(2, "payload", '{"active_window":9,"previous_window":1}')
    with pytest.raises(CorruptionError, match="seq 2"):
        load_state(store, use_checkpoints=False, checked=True)


def test_the_api_seals_and_attests_with_the_key_it_was_opened_with(store: EventStore, tmp_path: Path) -> None:
    """`Ledger(..., signing_key=PEM bytes or a path)`: seal() appends, attest() refuses without a hand-off."""
    from cryptography.hazmat.primitives import serialization

    from lifecycle_fsm.errors import InputError, NotFoundError
    from lifecycle_fsm.keys import new_key_pair

    with pytest.raises(InputError, match="signing key"):
        Ledger(store).seal()
    files = new_key_pair(tmp_path / "keys")
    for key in (files.private_key, files.private_key.read_bytes()):
        before = store.head()
        doc = Ledger(store, signing_key=key, actor="api").seal()
        assert (doc["seq"], doc["hash"], doc["key_id"]) == (before.seq, before.hash, files.key_id)
    public = serialization.load_pem_public_key(files.public_key.read_bytes())
    assert _verify(store, PublicKeys([public]))["seals"]["count"] == 2  # type: ignore[index, list-item]
    with pytest.raises(NotFoundError):
        Ledger(store, signing_key=files.private_key).attest("nobody-handed-off")
