"""A ledger written by release 0.1.0 is read and written by this code (the support policy): its chain,
seal and checkpoint verify, its states fold as that release left them, and a command appends to it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import cli

FIXTURES = Path(__file__).parent / "fixtures"
HEAD = "0231b5b8993805839c7fc2d0c6ad477814aba8bdf09553a841dcee29007e8923"


def test_a_ledger_written_by_0_1_0_reads_verifies_and_takes_a_command(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    shutil.copyfile(FIXTURES / "ledger-0.1.0.sqlite", db)
    pub = str(FIXTURES / "ledger-0.1.0-signing.pub")
    report = json.loads(cli(db, "verify", "--json", "--pubkey", pub).stdout)
    assert report["ok"] and report["head"] == {"seq": 14, "hash": HEAD}, report
    # Its checkpoint is of an older checkpoint schema: skipped (disposable), the log folded instead.
    assert [c["status"] for c in report["checkpoints"]] == ["stale"] and report["seals"]["count"] == 1
    states = {c["id"]: (c["state"], c["reason_codes"]) for c in json.loads(cli(db, "--json", "status").stdout)}
    assert states == {"dpo-v5": ("ready", []), "grpo-v7": ("received", ["window_changed"])}
    replayed = json.loads(cli(db, "replay", "--json").stdout)
    assert replayed["checkpoint"] is None
    assert replayed["skipped_checkpoints"] == [{"checkpoint_id": 1, "reason": "schema version 1 is not 2"}]
    assert replayed["states"] == json.loads(cli(db, "replay", "--full", "--json").stdout)["states"]
    assert cli(db, "window", "3").returncode == 0
    after = json.loads(cli(db, "verify", "--json", "--pubkey", pub).stdout)
    assert after["ok"] and after["head"]["seq"] == 15, after
