"""`lifecycle log`: each filter against `history` and an independent read of the file, in every output form."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from auditor_cases import auditor_ledger
from conftest import Workspace, invoke

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.replay.log import known_stream, log_filter, read_log
from lifecycle_fsm.store.sqlite import SQLiteEventStore


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The auditor ledger, plus bob's grpo candidate invalidated by a window advance."""
    ws = Workspace(tmp_path_factory.mktemp("log"))
    auditor_ledger(ws)
    with ws.ledger(actor="bob") as led:
        led.activate_baseline(ws.baseline("sft-2"))  # the first baseline was tampered with by the blocking case
        sft2 = hash_directory(ws.root / "sft-2" / "adapter")
        led.receive(ws.grpo("grpo-bob", evidence_window_index=5, source_policy_version=sft2))
        led.advance_window(5)
        assert led.check("grpo-bob").state == "verified"
        led.advance_window(6)  # invalidates grpo-bob (cause window)
    return ws


def _log(ws: Workspace, *args: str) -> list[dict[str, Any]]:
    result = invoke(ws.db, "log", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _rows(ws: Workspace) -> list[dict[str, Any]]:
    """Every row read with plain sqlite3: the oracle the filters are checked against."""
    with sqlite3.connect(ws.db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM events ORDER BY seq")]


def _seqs(docs: list[dict[str, Any]]) -> list[int]:
    return [d["seq"] for d in docs]


def test_stream_filter_is_history(logged: Workspace) -> None:
    """`log --stream ID` is `history ID --json` with each event's stream named."""
    for cid in ("dpo-good", "grpo-block", "grpo-bob"):
        history = json.loads(invoke(logged.db, "history", cid, "--json").stdout)
        assert [{k: v for k, v in d.items() if k != "stream_id"} for d in _log(logged, "--stream", cid)] == history
        assert {d["stream_id"] for d in _log(logged, "--stream", cid)} == {f"candidate:{cid}"}
    ledger = _log(logged, "--stream", "ledger")
    assert _seqs(ledger) == [r["seq"] for r in _rows(logged) if r["stream_id"] == "ledger"]


def test_position_time_type_and_actor_filters(logged: Workspace) -> None:
    """after/before exclusive, since/until inclusive, types any-of, actor exact; all combine."""
    rows = _rows(logged)
    assert _seqs(_log(logged)) == [r["seq"] for r in rows]
    assert _seqs(_log(logged, "--after", "3", "--before", "9")) == [4, 5, 6, 7, 8]
    since, until = rows[4]["recorded_at"], rows[9]["recorded_at"]
    assert _seqs(_log(logged, "--since", since, "--until", until)) == [r["seq"] for r in rows[4:10]]
    types = ["HandoffDecided", "EvidenceInvalidated"]
    assert _seqs(_log(logged, "--type", types[0], "--type", types[1])) == [r["seq"] for r in rows if r["type"] in types]
    assert _seqs(_log(logged, "--actor", "bob")) == [r["seq"] for r in rows if r["actor"] == "bob"]
    both = _log(logged, "--actor", "bob", "--type", "WindowAdvanced", "--after", str(rows[-3]["seq"]))
    assert [(d["actor"], d["type"]) for d in both] == [("bob", "WindowAdvanced")]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("source_policy", {("dpo-old", "ChecksRecorded")}),
        ("artifact", {("dpo-tamper", "ChecksRecorded")}),
        ("upstream_reject", {("dpo-up", "HandoffDecided")}),
        ("upstream_state", {("dpo-maybe", "HandoffDecided")}),
        ("branch_evidence", {("grpo-stale", "ChecksRecorded")}),
        ("block_update", {("grpo-block", "RecoveryPlanned")}),
        ("window_changed", {("grpo-bob", "EvidenceInvalidated")}),
        ("rollback", set()),
    ],
)
def test_reason_filter_matches_the_evidence(logged: Workspace, code: str, expected: set[tuple[str, str]]) -> None:
    """`--reason CODE` finds the checks, hand-offs, blocking plans and invalidations that carry it, and nothing else."""
    found = {(d["stream_id"].removeprefix("candidate:"), d["type"]) for d in _log(logged, "--reason", code)}
    assert found == expected
    for cid, _ in expected:
        codes = json.loads(invoke(logged.db, "explain", cid, "--json").stdout)["reason_codes"]
        assert code in codes  # the code `log --reason` takes is the one `explain` shows


def test_limit_pages_and_output_forms(logged: Workspace) -> None:
    """--limit keeps the first N in seq order; --after the last seq shown is the next page; jsonl = json; text lines."""
    everything = _log(logged)
    pages: list[dict[str, Any]] = []
    while True:
        page = _log(logged, "--limit", "7", "--after", str(pages[-1]["seq"] if pages else 0))
        if not page:
            break
        pages += page
    assert pages == everything
    jsonl = invoke(logged.db, "log", "--jsonl", "--type", "ChecksRecorded").stdout.splitlines()
    assert [json.loads(line) for line in jsonl] == _log(logged, "--type", "ChecksRecorded")
    text = invoke(logged.db, "log", "--reason", "artifact").stdout
    seq = _log(logged, "--reason", "artifact")[0]["seq"]
    assert f"{seq:>8}  " in text and "candidate:dpo-tamper  ChecksRecorded  [artifact]  by auditor-test" in text
    assert invoke(logged.db, "log", "--actor", "nobody").stdout == "no events match\n"
    assert _log(logged, "--actor", "nobody") == []


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--type", "CheckRecorded"], 3, "unknown event type 'CheckRecorded'"),
        (["--reason", "freshness"], 3, "unknown reason code 'freshness'"),
        (["--reason", "window"], 3, "unknown reason code 'window'"),  # an event's cause, not a reason code
        (["--since", "last tuesday"], 2, "not an ISO 8601 time"),
        (["--limit", "-1"], 2, "--limit"),
        # Bytes that are not UTF-8 (a shell's $'\xff'): a UnicodeEncodeError traceback from the driver, exit 1.
        (["--actor", "\udcff\udcfe"], 3, "actor '\\udcff\\udcfe' is not valid Unicode text"),
        (["--stream", "candidate:\udcff"], 3, "is not valid Unicode text"),
    ],
)
def test_bad_filters_are_refused(logged: Workspace, args: list[str], code: int, message: str) -> None:
    """A typo in a type or reason code is refused (never an empty answer that looks like "nothing happened")."""
    result = invoke(logged.db, "log", *args)
    assert (result.exit_code, result.stdout) == (code, "")
    assert result.stderr.startswith("Error: ") and message in result.stderr


@pytest.mark.parametrize("args", [["log", "--json", "--jsonl"], ["--json", "log", "--jsonl"]], ids=["after", "root"])
def test_json_and_jsonl_together_are_a_usage_error(logged: Workspace, args: list[str]) -> None:
    """Two output forms asked at once are refused, as `explain --json --format md` is (not one picked silently)."""
    result = invoke(logged.db, *args)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith(
        "Error: --json asks for one JSON array and --jsonl for one object per line: give one of them (see `"
    )
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("form", [["--json"], ["--jsonl"], []], ids=["json", "jsonl", "text"])
@pytest.mark.parametrize("stream", ["nosuch", "candidate:nosuch", "dpo-GOOD"])
def test_an_unknown_stream_is_not_found(logged: Workspace, stream: str, form: list[str]) -> None:
    """A stream no event belongs to is exit 4 with nothing on stdout, as `history`/`explain` of an unknown
    id are, not `[]`, which reads as "nothing happened to it"."""
    result = invoke(logged.db, "log", "--stream", stream, *form)
    assert (result.exit_code, result.stdout) == (4, "")
    assert result.stderr == (
        f"Error: unknown stream: {stream!r} (no candidate has that id; the ledger's own streams are 'ledger' "
        "and 'seals')\n"
    )


def test_a_known_stream_with_nothing_in_range_is_empty(logged: Workspace) -> None:
    """Known means any event at all: a candidate with no event in the asked range, or `seals` in a ledger
    never sealed, answers `[]` (exit 0)."""
    head = _rows(logged)[-1]["seq"]
    assert _log(logged, "--stream", "dpo-good", "--after", str(head)) == []
    assert _log(logged, "--stream", "dpo-good", "--type", "RecoveryPlanned") == []
    assert _log(logged, "--stream", "seals") == [] and not [r for r in _rows(logged) if r["stream_id"] == "seals"]
    assert invoke(logged.db, "log", "--stream", "dpo-good", "--after", str(head)).stdout == "no events match\n"


def test_the_stream_is_judged_in_the_snapshot_the_query_reads(ws: Workspace) -> None:
    """`known_stream` holds one read snapshot: an event another writer appends after the check is not
    in the answer (so the check and the rows describe the same log)."""
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.dpo())
    query = log_filter(stream="dpo-v5")
    with SQLiteEventStore(ws.db) as store, known_stream(store, query, "dpo-v5"):
        first = [e.seq for e, _ in read_log(store, query)]
        with ws.ledger() as other:
            other.check("dpo-v5")  # committed by another connection meanwhile
        assert [e.seq for e, _ in read_log(store, query)] == first
    assert len(_log(ws, "--stream", "dpo-v5")) == len(first) + 1
    with (
        SQLiteEventStore(ws.db) as store,
        pytest.raises(NotFoundError, match="unknown stream: 'nosuch'"),
        known_stream(store, log_filter(stream="nosuch"), "nosuch"),
    ):
        pytest.fail("the body of an unknown stream's read never runs")


def test_a_tampered_row_is_refused(logged: Workspace, tmp_path: Any) -> None:
    """log recomputes each row's hash before printing it: an edited payload is an integrity error naming the seq."""
    copy = tmp_path / "copy.db"
    with sqlite3.connect(logged.db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    with sqlite3.connect(copy) as conn:
        conn.execute("DROP TRIGGER events_refuse_update")
        conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = 4")
    result = invoke(copy, "log", "--after", "3", "--limit", "1")
    assert result.exit_code == 6 and "seq 4" in result.stderr
    # `--json` is one document: a row refused midway leaves stdout empty, never `[` and the rows before it
    as_json = invoke(copy, "--json", "log", "--limit", "8")
    assert (as_json.exit_code, as_json.stdout) == (6, "") and "seq 4" in as_json.stderr


@pytest.mark.parametrize("deleted", [2, 3])
def test_a_row_deleted_from_the_log_is_refused_not_skipped(logged: Workspace, tmp_path: Any, deleted: int) -> None:
    """Every other row still re-hashes, so only the chain shows the hole: an unfiltered log follows it
    and stops at the row after the gap (exit 6), instead of printing the log without it, exit 0."""
    copy = tmp_path / "copy.db"
    with sqlite3.connect(logged.db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    with sqlite3.connect(copy) as conn:
        conn.execute("DROP TRIGGER events_refuse_delete")
        conn.execute("DELETE FROM events WHERE seq = ?", (deleted,))
    hole = f"does not go on from seq {deleted - 1}: seq {deleted} is missing"
    for args in (
        ["log"],
        ["log", "--jsonl"],
        ["log", "--limit", "5"],
        ["log", "--after", str(deleted - 1)],
        ["log", "--after", str(deleted - 2), "--before", str(deleted + 1)],
    ):
        result = invoke(copy, *args)
        assert result.exit_code == 6 and hole in result.stderr, (args, result.stderr)
    after = invoke(copy, "log", "--after", str(deleted), "--limit", "2")  # a slice past the hole is sound
    assert after.exit_code == 0, after.stderr
    before = invoke(copy, "log", "--before", str(deleted))  # and one that ends before it
    assert before.exit_code == 0, before.stderr
    filtered = invoke(copy, "log", "--type", "CandidateReceived")  # a filter cannot tell a hole from a miss
    assert filtered.exit_code == 0


def test_a_baseline_change_is_found_by_the_code_status_shows(ws: Workspace) -> None:
    """After a baseline change a decided candidate shows `baseline_changed`; `log --reason baseline_changed`
    finds that invalidation, and the event's bare cause `baseline` is not a second name for it."""
    with ws.ledger() as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
        ledger.check("dpo-v5")
        ledger.activate_baseline(ws.baseline("sft-v2"))
    assert json.loads(invoke(ws.db, "status", "dpo-v5", "--json").stdout)["reason_codes"] == ["baseline_changed"]
    found = [(d["stream_id"], d["type"]) for d in _log(ws, "--reason", "baseline_changed")]
    assert found == [("candidate:dpo-v5", "EvidenceInvalidated")]
    refused = invoke(ws.db, "log", "--reason", "baseline")
    assert refused.exit_code == 3 and "unknown reason code 'baseline'" in refused.stderr
    assert "baseline_changed" in refused.stderr
