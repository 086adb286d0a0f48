"""Candidate ids that the stream naming cannot represent unambiguously are refused at receive.

`log --stream` and `Ledger.events(stream=...)` take a candidate id, or `ledger` / `seals`
(SPEC §10, §11), and every candidate's stored stream is `candidate:<id>`. A candidate
called `ledger` or `seals` would be read back as the ledger's own stream, one called
`candidate:x` as another candidate's, and one with surrounding whitespace prints like
another id: the auditor would never see its events. So receive refuses them (InputError,
exit 3, nothing appended), whether the id comes from `--id` or from the manifest's
`policy_version` (the default id).
"""

from __future__ import annotations

import orjson
import pytest

from lifecycle_fsm import InputError
from lifecycle_fsm.limits import check_candidate_id
from tests.conftest import Workspace, cli, count_events

BAD_IDS = [
    "ledger",
    "seals",
    "candidate:x",
    "candidate:",
    "candidate:ledger",
    " dpo-v5",
    "dpo-v5 ",
    "\tdpo",
    "ledger\n",
]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_receive_refuses_an_id_that_names_another_stream(ws: Workspace, bad: str) -> None:
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        before = count_events(ws.db)
        with pytest.raises(InputError, match="candidate id"):
            ledger.receive(ws.dpo(), candidate_id=bad)
        assert count_events(ws.db) == before
        assert ledger.candidate_ids() == []


@pytest.mark.parametrize(
    ("bad", "why"), [("ledger", "reserved"), ("seals", "reserved"), ("candidate:x", "prefix"), (" x", "whitespace")]
)
def test_the_cli_refuses_them_with_one_line_saying_why(ws: Workspace, bad: str, why: str) -> None:
    assert cli(ws.db, "baseline", "activate", str(ws.baseline())).returncode == 0
    before = count_events(ws.db)
    done = cli(ws.db, "receive", str(ws.dpo()), "--id", bad)
    assert done.returncode == 3, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), done.stderr
    assert why in lines[0] and "--id" in lines[0]
    assert count_events(ws.db) == before


@pytest.mark.parametrize("version", ["ledger", "seals", "candidate:dpo"])
def test_a_policy_version_that_is_a_reserved_name_is_refused_as_the_default_id(ws: Workspace, version: str) -> None:
    assert cli(ws.db, "baseline", "activate", str(ws.baseline())).returncode == 0
    before = count_events(ws.db)
    done = cli(ws.db, "receive", str(ws.dpo(policy_version=version)))
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert repr(version) in done.stderr
    assert count_events(ws.db) == before
    # With an unambiguous --id the same manifest is received (and judged by its check as usual).
    assert cli(ws.db, "receive", str(ws.dpo(policy_version=version)), "--id", "dpo-x").returncode == 0


def test_the_ledger_stream_holds_only_the_ledgers_events(ws: Workspace) -> None:
    """The tester's reproduction: `receive M --id ledger` then `log --stream ledger`."""
    assert cli(ws.db, "baseline", "activate", str(ws.baseline())).returncode == 0
    assert cli(ws.db, "receive", str(ws.dpo()), "--id", "ledger").returncode == 3
    log = cli(ws.db, "--json", "log", "--stream", "ledger")
    assert log.returncode == 0, log.stderr
    assert {e["stream_id"] for e in orjson.loads(log.stdout)} == {"ledger"}
    with ws.ledger() as ledger:
        assert {e.type for e in ledger.events(stream="ledger")} <= {"LedgerInitialized", "BaselineActivated"}


@pytest.mark.parametrize("good", ["dpo-v5", "ledger-v2", "my ledger", "seals2", "Candidate:x", "x:candidate:y"])
def test_ids_that_only_resemble_a_reserved_name_are_accepted(good: str) -> None:
    assert check_candidate_id(good) == good


def test_an_audit_refuses_a_reserved_policy_version_before_appending_anything(ws: Workspace) -> None:
    """`audit` names candidates by policy_version: a manifest whose id would be `ledger` is refused while
    the manifests are read (exit 3), not after the candidates before it were received and decided."""
    baseline = ws.baseline()
    sound, reserved = ws.dpo(), ws.grpo("grpo-x", policy_version="ledger")
    args = [
        "--baseline",
        str(baseline),
        "--candidates",
        str(sound),
        str(reserved),
        "--label",
        "t1",
        "--mode",
        "real_artifact",
        "--root",
        str(ws.root),
        "--out",
        str(ws.root / "out"),
    ]
    done = cli(ws.db, "audit", *args)
    assert done.returncode == 3, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'ledger' is reserved" in lines[0] and "grpo-x/manifest.json" in lines[0], lines
    assert count_events(ws.db) == 0
    assert not (ws.root / "out").exists()
