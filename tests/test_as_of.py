"""Time travel: `explain` and `status` as of a seq or a time, before and after a baseline advance."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from conftest import Workspace, invoke

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay.log import parse_as_of, parse_time
from lifecycle_fsm.store.sqlite import SQLiteEventStore

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


class Clock:
    """One second per event, from T0 (so each event's time is known to the test)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return (T0 + dt.timedelta(seconds=self.n)).isoformat(timespec="microseconds").replace("+00:00", "Z")


def at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


@pytest.fixture
def advanced(ws: Workspace) -> dict[str, int]:
    """dpo-v5 ready under baseline A, then baseline B (invalidated: received), then checked against B (reject)."""
    first, second = ws.baseline("sft-a"), ws.baseline("sft-b")
    manifest = ws.dpo()  # claims baseline A (the workspace's first SFT)
    led = Ledger(SQLiteEventStore(ws.db, synchronous="NORMAL"), clock=Clock(), actor="t")
    with led:
        led.init()  # seq 1, t+1
        led.activate_baseline(first)  # seq 2, t+2
        led.receive(manifest)  # seq 3, t+3
        led.check("dpo-v5")  # seq 4, t+4
        ready = led.hand_off("dpo-v5").events[-1].seq  # seq 5, t+5
        advance = led.activate_baseline(second).events  # seq 6 (t+6) and the invalidation, seq 7 (t+7)
        checked = led.check("dpo-v5").events[-1].seq  # seq 8, t+8
    return {"ready": ready, "baseline": advance[0].seq, "invalidated": advance[-1].seq, "checked": checked}


def _json(ws: Workspace, *args: str) -> Any:
    result = invoke(ws.db, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_explain_by_seq_before_and_after_the_baseline_advance(ws: Workspace, advanced: dict[str, int]) -> None:
    """Ready at the hand-off's seq, received (baseline_changed) once B was activated, reject once checked against B."""
    then = _json(ws, "explain", "dpo-v5", "--as-of", str(advanced["baseline"]))
    assert (then["state"], then["decisive_event"]["type"], then["as_of"]) == ("ready", "HandoffDecided", 6)
    after = _json(ws, "explain", "dpo-v5", "--as-of", str(advanced["invalidated"]))
    assert (after["state"], after["reason_codes"]) == ("received", ["baseline_changed"])
    assert after["invalidation"]["previous"] != after["invalidation"]["current"]
    now = _json(ws, "explain", "dpo-v5")
    assert (now["state"], now["reason_codes"]) == ("reject", ["source_policy"])
    lineage = next(c for c in now["checks"] if c["check"] == "source_policy")
    assert (
        lineage["claimed"] == after["invalidation"]["previous"]
        and lineage["checked_against"] == after["invalidation"]["current"]
    )


def test_explain_and_status_by_time(ws: Workspace, advanced: dict[str, int]) -> None:
    """A time means every event recorded at or before it: offsets and naive (UTC) times name the same instant."""
    before = _json(ws, "explain", "dpo-v5", "--as-of", at(5.5))
    assert (before["state"], before["as_of"]) == ("ready", 5)
    assert _json(ws, "explain", "dpo-v5", "--as-of", at(5))["as_of"] == 5  # inclusive
    same = (T0 + dt.timedelta(seconds=5.5)).astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()
    assert _json(ws, "explain", "dpo-v5", "--as-of", same)["as_of"] == 5
    naive = (T0 + dt.timedelta(seconds=7)).replace(tzinfo=None).isoformat()
    after = _json(ws, "explain", "dpo-v5", "--as-of", naive)
    assert (after["state"], after["as_of"]) == ("received", 7)
    assert [d["state"] for d in _json(ws, "status", "--as-of", at(5.5))] == ["ready"]
    assert [d["state"] for d in _json(ws, "status", "--as-of", at(7))] == ["received"]
    assert _json(ws, "status", "dpo-v5", "--as-of", str(advanced["ready"]))["state"] == "ready"
    assert _json(ws, "status", "--as-of", at(0.5)) == []  # before anything was recorded
    assert _json(ws, "status", "--as-of", "2099-01-01")[0]["state"] == "reject"  # a future time is the head


def test_a_writer_whose_clock_is_behind_records_no_time_before_the_head(ws: Workspace) -> None:
    """Two supervisors on one ledger, the second's clock three minutes behind: its events are stored with the
    time at the head, so as of any time the answer is every event recorded by then, a prefix of the log."""
    ahead = Ledger(SQLiteEventStore(ws.db, synchronous="NORMAL"), clock=Clock(), actor="ahead")
    behind_clock = Clock()
    behind_clock.n = -180
    behind = Ledger(SQLiteEventStore(ws.db, synchronous="NORMAL"), clock=behind_clock, actor="behind")
    with ahead, behind:
        ahead.init()  # t+1
        ahead.activate_baseline(ws.baseline())  # t+2
        behind.receive(ws.dpo())  # its clock says t-179: stored at t+2
        ahead.receive(ws.grpo())  # t+3
    times = [row["recorded_at"] for row in map(json.loads, invoke(ws.db, "log", "--jsonl").stdout.splitlines())]
    stored = [
        (T0 + dt.timedelta(seconds=n)).isoformat(timespec="microseconds").replace("+00:00", "Z") for n in (1, 2, 2, 3)
    ]
    assert times == stored
    assert [d["id"] for d in _json(ws, "status", "--as-of", at(2.5))] == ["dpo-v5"]
    assert _json(ws, "status", "--as-of", at(1.5)) == []


def test_status_as_of_text_names_the_position(ws: Workspace, advanced: dict[str, int]) -> None:
    """Without --json, status --as-of says which position it shows."""
    out = invoke(ws.db, "status", "--as-of", at(5.5)).stdout
    assert out.startswith("as of seq 5\n") and "ready" in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["explain", "dpo-v5", "--as-of", "9999"], 3, "past the head of the log (seq 8)"),
        (["status", "--as-of", "9999"], 3, "past the head"),
        (["status", "dpo-v5", "--as-of", "9999"], 3, "past the head"),
        (["explain", "dpo-v5", "--as-of", "2"], 4, "unknown candidate: 'dpo-v5' as of seq 2: none of its events yet"),
        (["status", "dpo-v5", "--as-of", "2"], 4, "unknown candidate"),
        (
            ["explain", "dpo-v5", "--as-of", "2026-03-01T12:00:00Z"],
            4,
            "as of 2026-03-01T12:00:00.000000Z (the log up to seq 0)",
        ),
        (["explain", "dpo-v5", "--as-of", "yesterday"], 2, "not an ISO 8601 time"),
        (["explain", "dpo-v5", "--as-of", "0"], 4, "unknown candidate: 'dpo-v5' as of seq 0: none of its events yet"),
        (["status", "dpo-v5", "--as-of", "0"], 4, "unknown candidate"),
        (["status", "--as-of", "\u00b2"], 2, "not an ISO 8601 time"),  # isdigit() but not int(): was a traceback
        (["status", "--as-of", "0001-01-01T00:00:00+01:00"], 2, "outside the years 1 to 9999"),  # was a traceback
        (["log", "--since", "9999-12-31T23:59:59-01:00"], 2, "outside the years 1 to 9999"),
        # replay --to holds a seq to the same rules (it replayed "to seq 8" for --to 9999, exit 0)
        (["replay", "--to", "9999"], 3, "Error: --to 9999 is past the head of the log (seq 8)\n"),
        (["replay", "--to", "-1"], 2, "--to -1: a seq is a whole number from 0"),
        (["replay", "--to", "x"], 2, "--to x: not a seq"),
        # int() refuses 4300+ digits: a ValueError traceback (exit 1), not a usage error
        (["replay", "--to", "9" * 5000], 2, "no seq is that large"),
        (["status", "--as-of", "9" * 5000], 2, "no seq is that large"),
        (["status", "--as-of", "0" * 4400 + "9999"], 3, "past the head of the log (seq 8)"),
    ],
)
def test_as_of_refusals(ws: Workspace, advanced: dict[str, int], args: list[str], code: int, message: str) -> None:
    """Past the head: exit 3; before the candidate existed: exit 4 (SPEC §11); not a seq or a time: usage, exit 2."""
    result = invoke(ws.db, *args)
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("Error: ") and message in result.stderr and result.stdout == ""


@pytest.mark.parametrize("value", ["-1", "-0", "+3", " -7"])
@pytest.mark.parametrize("command", [["explain", "dpo-v5"], ["status"], ["status", "dpo-v5"]], ids=" ".join)
def test_a_signed_number_as_of_says_what_a_seq_is(
    ws: Workspace, advanced: dict[str, int], command: list[str], value: str
) -> None:
    """`--as-of -1` was meant as a seq: the usage error says a seq is a whole number from 0 (or give a time),
    not that "-1" failed to parse as an ISO 8601 time."""
    result = invoke(ws.db, *command, "--as-of", value)
    assert (result.exit_code, result.stdout) == (2, "")
    shown = value.strip()
    assert result.stderr.startswith(
        f"Error: Invalid value for '--as-of': --as-of {shown}: a seq is a whole number from 0, written in plain "
        "digits (or give an ISO 8601 time, e.g. 2026-11-30T12:00:00Z) (see `"
    ), result.stderr
    assert "not an ISO 8601 time" not in result.stderr and result.stderr.count("\n") == 1


def test_replay_to_the_head_and_before_it(ws: Workspace, advanced: dict[str, int]) -> None:
    """`replay --to` the head is the whole log; an earlier seq shows the state then, as `status --as-of` does."""
    assert _json(ws, "replay", "--to", "8")["position"] == 8
    then = _json(ws, "replay", "--to", str(advanced["ready"]))
    assert then["position"] == advanced["ready"] and [d["state"] for d in then["states"]] == ["ready"]


def test_parse_time_and_as_of() -> None:
    """ISO 8601 in any offset becomes the stored UTC form; digits are a seq; fractions beyond microseconds are cut."""
    assert parse_time("2026-03-01T14:00:00+02:00") == "2026-03-01T12:00:00.000000Z"
    assert parse_time("2026-03-01 12:00") == "2026-03-01T12:00:00.000000Z"
    assert parse_time("2026-03-01T12:00:00.1234567Z") == "2026-03-01T12:00:00.123456Z"
    assert parse_as_of("42") == 42 and parse_as_of("2026-03-01") == "2026-03-01T00:00:00.000000Z"
    with pytest.raises(InputError):
        parse_time("12:00 tomorrow")
    for outside in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        with pytest.raises(InputError, match="outside the years 1 to 9999"):
            parse_time(outside)
