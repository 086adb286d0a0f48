"""An idempotency key on every write command (SPEC §10): a replayed run appends nothing.

The supervisor here names each command `<run>/<step>/<command>`, the scheme the
README recommends; running the whole thing again (a supervisor restarted from its
first step) must find every key recorded and append nothing, on both backends.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import orjson
import pytest

from lifecycle_fsm import (
    CandidateResult,
    DuplicateEventError,
    InputError,
    Ledger,
    LedgerClosedError,
    LifecycleError,
    SettingsResult,
    State,
    StoreError,
)
from lifecycle_fsm.events import LEDGER_STREAM
from tests.conftest import Workspace, cli, count_events, invoke, run_cli

Result = CandidateResult | SettingsResult


def _supervisor_run(ledger: Ledger, ws: Workspace, files: dict[str, Path], run: str) -> list[Result]:
    """Every write command the API has, each with its key."""
    k = lambda step, command: f"{run}/{step}/{command}"  # noqa: E731
    done: list[Result] = [
        ledger.init(2, 1, event_id=k(0, "init")),
        ledger.activate_baseline(files["sft"], event_id=k(0, "baseline")),
        ledger.activate_evaluation("eval-v1", event_id=k(0, "evaluation")),
        ledger.receive(files["dpo"], event_id=k(1, "receive")),
        ledger.receive(files["grpo"], event_id=k(2, "receive")),
        ledger.record_trusted_state("grpo-v7", "prompt_queue", files["queue"], event_id=k(2, "trusted")),
        ledger.record_trusted_state("grpo-v7", "trajectories", files["traj"], event_id=k(3, "trusted")),
        ledger.invalidate_trusted_state("grpo-v7", "trajectories", "reward model changed", event_id=k(3, "untrust")),
        ledger.fail_stage("grpo-v7", "reward", event_id=k(4, "fail")),
        ledger.complete_recovery("grpo-v7", event_id=k(4, "recovered")),
        ledger.check("grpo-v7", event_id=k(5, "check")),
        ledger.check("dpo-v5", event_id=k(5, "check-dpo")),
        ledger.advance_window(2, event_id=k(6, "window")),  # sends the verified grpo back to received
        ledger.check("grpo-v7", event_id=k(7, "check")),
        ledger.hand_off("grpo-v7", event_id=k(8, "handoff")),
        ledger.hand_off("dpo-v5", event_id=k(8, "handoff-dpo")),
    ]
    return done


def _files(ws: Workspace) -> dict[str, Path]:
    (ws.root / "queue.jsonl").write_text('{"prompt": 1}\n')
    (ws.root / "traj.jsonl").write_text('{"completion": "x"}\n')
    return {
        "sft": ws.baseline(),
        "dpo": ws.dpo(evaluation_version="eval-v1"),
        "grpo": ws.grpo(evaluation_version="eval-v1"),
        "queue": ws.root / "queue.jsonl",
        "traj": ws.root / "traj.jsonl",
    }


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_replayed_supervisor_run_appends_nothing(ws: Workspace, backend: str, request: pytest.FixtureRequest) -> None:
    target = str(ws.db) if backend == "sqlite" else request.getfixturevalue("pg_url")
    files = _files(ws)
    with Ledger.open(target, actor="supervisor-a") as ledger:
        first = _supervisor_run(ledger, ws, files, "run-7")
        head = ledger.store.head()
    assert all(r.appended for r in first)
    assert (first[-2].state, first[-1].state) == (State.READY, State.READY)  # type: ignore[union-attr]
    with Ledger.open(target, actor="supervisor-a-restarted") as ledger:
        again = _supervisor_run(ledger, ws, files, "run-7")
        assert ledger.store.head() == head
    assert [r.duplicate for r in again] == [True] * len(first)
    assert [[e.seq for e in r.events] for r in again] == [[e.seq for e in r.events] for r in first]


def test_a_retried_trusted_state_or_recovery_is_a_duplicate_not_a_row(ws: Workspace, ledger: Ledger) -> None:
    files = _files(ws)
    ledger.activate_baseline(files["sft"])
    ledger.receive(files["grpo"])
    first = ledger.record_trusted_state("grpo-v7", "prompt_queue", files["queue"], event_id="r/1/trusted")
    retried = ledger.record_trusted_state("grpo-v7", "prompt_queue", files["queue"], event_id="r/1/trusted")
    assert retried.duplicate and retried.events == first.events
    ledger.fail_stage("grpo-v7", "sampling", event_id="r/2/fail")
    ledger.complete_recovery("grpo-v7", event_id="r/2/recovered")
    retried_recovery = ledger.complete_recovery("grpo-v7", event_id="r/2/recovered")  # received now: not an error
    assert retried_recovery.duplicate and retried_recovery.state is State.RECEIVED
    types = [e.type for e in ledger.store.read_stream("candidate:grpo-v7")]
    assert types.count("TrustedStateRecorded") == 1 and types.count("RecoveryCompleted") == 1


def test_a_retried_trusted_state_answers_after_the_file_was_rotated_away(ws: Workspace, ledger: Ledger) -> None:
    """A training loop keeps a few checkpoints and deletes older ones: a supervisor that recorded one,
    lost the reply and retried after the file was rotated away got "no such trusted-state path"
    (InputError, the path checked before the key was looked up), never the answer it had committed.
    The key is what a retry is matched by (with the kind and path): it answers; a new key still
    needs the file."""
    files = _files(ws)
    ledger.activate_baseline(files["sft"])
    ledger.receive(files["grpo"])
    saved = ws.root / "pre_update.ckpt"
    saved.write_bytes(b"optimizer state")
    first = ledger.record_trusted_state("grpo-v7", "pre_update_checkpoint", saved, event_id="r/1/trusted")
    saved.unlink()
    with Ledger.open(ws.db) as restarted:  # the supervisor's next process
        retried = restarted.record_trusted_state("grpo-v7", "pre_update_checkpoint", saved, event_id="r/1/trusted")
        assert retried.duplicate and retried.events == first.events
        before = count_events(ws.db)
        with pytest.raises(InputError, match="no such trusted-state path"):
            restarted.record_trusted_state("grpo-v7", "pre_update_checkpoint", saved, event_id="r/2/trusted")
        assert count_events(ws.db) == before


def test_a_retried_receive_or_baseline_answers_after_the_manifest_was_removed(ws: Workspace, ledger: Ledger) -> None:
    """A supervisor that writes a manifest, receives it with a key, removes it and loses the reply got
    "no such manifest" on the retry, never its committed answer. A keyed receive or activation whose
    manifest is gone answers from the key when that key recorded this path (and id); another key, a
    key of another path or command, or no key still reports the missing file, appending nothing."""
    files = _files(ws)
    sft = files["sft"].parent / "tmp-sft.json"  # beside the adapter its manifest names
    sft.write_bytes(files["sft"].read_bytes())
    manifest = files["grpo"].parent / "tmp-grpo.json"
    manifest.write_bytes(files["grpo"].read_bytes())
    base = ledger.activate_baseline(sft, event_id="r/1/baseline")
    first = ledger.receive(manifest, candidate_id="grpo-a", event_id="r/1/receive")
    sft.unlink()
    manifest.unlink()
    with Ledger.open(ws.db) as restarted:  # the supervisor's next process
        again = restarted.activate_baseline(sft, event_id="r/1/baseline")
        assert again.duplicate and again.settings == base.settings
        assert again.events == tuple(e for e in base.events if e.event_id == "r/1/baseline")  # as any retry
        retried = restarted.receive(manifest, candidate_id="grpo-a", event_id="r/1/receive")
        assert retried.duplicate and retried.events == first.events and retried.candidate == first.candidate
        assert restarted.receive(manifest.parent / "." / manifest.name, event_id="r/1/receive").duplicate
        before = count_events(ws.db)
        for refused in (
            lambda: restarted.receive(manifest, candidate_id="grpo-a", event_id="r/2/receive"),  # a new key
            lambda: restarted.receive(manifest, candidate_id="grpo-b", event_id="r/1/receive"),  # another id
            lambda: restarted.receive(ws.root / "other.json", event_id="r/1/receive"),  # another path
            lambda: restarted.receive(manifest, event_id="r/1/baseline"),  # another command's key
            lambda: restarted.activate_baseline(sft, event_id="r/1/receive"),
            lambda: restarted.receive(manifest),
        ):
            with pytest.raises(InputError, match="no such manifest"):
                refused()
        assert count_events(ws.db) == before


def test_keys_are_global_across_supervisors(ws: Workspace, ledger: Ledger) -> None:
    """Two supervisors using one key for different commands: the second is refused, never silently merged."""
    files = _files(ws)
    ledger.activate_baseline(files["sft"])
    ledger.receive(files["dpo"], event_id="step-1/receive")
    before = ledger.store.head()
    with pytest.raises(DuplicateEventError, match="step-1/receive"):
        ledger.receive(files["grpo"], event_id="step-1/receive")
    assert ledger.store.head() == before


def test_every_cli_write_takes_an_event_id(ws: Workspace) -> None:
    """Each write subcommand twice with one key: the second run appends nothing and says so.

    `--json` carries `appended` every time (true, then false on the retry, with the first
    call's events); the text of a retry ends "(no change: nothing appended)", `fail` too.
    """
    files = _files(ws)
    commands = [
        ["init", "--event-id", "c/init"],
        ["baseline", "activate", str(files["sft"]), "--event-id", "c/baseline"],
        ["evaluation", "activate", "eval-v1", "--event-id", "c/evaluation"],
        ["receive", str(files["grpo"]), "--event-id", "c/receive"],
        ["trusted", "grpo-v7", "prompt_queue", str(files["queue"]), "--event-id", "c/trusted"],
        ["untrust", "grpo-v7", "prompt_queue", "--event-id", "c/untrust"],
        ["fail", "grpo-v7", "--stage", "sampling", "--event-id", "c/fail"],
        ["recovered", "grpo-v7", "--event-id", "c/recovered"],
        ["check", "grpo-v7", "--event-id", "c/check"],
        ["window", "2", "--event-id", "c/window"],
        ["check", "grpo-v7", "--event-id", "c/check-2"],
        ["handoff", "grpo-v7", "--event-id", "c/handoff"],
    ]
    firsts = []
    for args in commands:
        first = invoke(ws.db, "--json", *args)
        assert first.exit_code == 0, (args, first.output)
        firsts.append(orjson.loads(first.output))
        assert firsts[-1]["appended"] is True and firsts[-1]["events"], args
    heads = sqlite3.connect(ws.db).execute("SELECT max(seq) FROM events").fetchone()
    for args, first_doc in zip(commands, firsts, strict=True):
        again = invoke(ws.db, "--json", *args)
        assert again.exit_code == 0, (args, again.output)
        doc = orjson.loads(again.output)
        assert doc["appended"] is False and doc["events"] == first_doc["events"], args
        assert doc.keys() == first_doc.keys(), args  # the same shape as the first answer
        text = invoke(ws.db, *args)
        assert text.exit_code == 0, (args, text.output)
        assert text.output.splitlines()[0].endswith(" (no change: nothing appended)"), (args, text.output)
    assert sqlite3.connect(ws.db).execute("SELECT max(seq) FROM events").fetchone() == heads


def test_a_retried_fail_after_the_candidate_moved_on_reports_the_first_plan(ws: Workspace) -> None:
    """`fail --event-id K` again once the candidate was recovered, checked and sent back by a window:
    the first plan, events and state, `appended: false`, and text that says nothing was appended (the
    last call a real process)."""
    files = _files(ws)
    grpo = "grpo-v7"
    for args in (
        ["init"],
        ["baseline", "activate", str(files["sft"])],
        ["receive", str(files["grpo"])],
        ["trusted", grpo, "trajectories", str(files["traj"])],
    ):
        assert cli(ws.db, *args).returncode == 0, args
    first = cli(ws.db, "--json", "fail", grpo, "--stage", "reward", "--event-id", "K")
    assert first.returncode == 0, first.stderr
    planned = orjson.loads(first.stdout)
    assert planned["appended"] is True and planned["state"] == "recovering"
    for args in (["recovered", grpo], ["check", grpo], ["window", "4"], ["check", grpo]):
        assert cli(ws.db, *args).returncode == 0, args
    assert orjson.loads(cli(ws.db, "--json", "status", grpo).stdout)["state"] == "reject"  # window age 3 > 2
    head = count_events(ws.db)
    again = cli(ws.db, "--json", "fail", grpo, "--stage", "reward", "--event-id", "K")
    assert again.returncode == 0, again.stderr
    doc = orjson.loads(again.stdout)
    assert doc["appended"] is False and doc.keys() == planned.keys()
    same = ("stage", "recovery_state", "reused_state", "action", "path", "sha256", "events", "trusted_states")
    assert {k: doc[k] for k in same} == {k: planned[k] for k in same}
    assert doc["state"] == "recovering"  # as the first call left it, though it stands in reject now
    text = run_cli(ws.db, "fail", grpo, "--stage", "reward", "--event-id", "K")
    assert text.returncode == 0, text.stderr
    assert text.stdout == (
        f"{grpo}: reward failed -> resume_reward_from_saved_trajectories (reuse trajectories); state recovering"
        " (no change: nothing appended)\n"
    )
    assert count_events(ws.db) == head


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_retried_hand_off_answers_its_decision_after_the_candidate_moved_on(
    ws: Workspace, backend: str, request: pytest.FixtureRequest
) -> None:
    """A supervisor that lost the hand-off's reply, retrying after another process sent the candidate
    back (a new evaluation version), is told the decision it made: ready, not received."""
    target = str(ws.db) if backend == "sqlite" else request.getfixturevalue("pg_url")
    files = _files(ws)
    with Ledger.open(target) as ledger:
        ledger.activate_baseline(files["sft"])
        ledger.activate_evaluation("eval-v1")
        ledger.receive(files["grpo"])
        ledger.check("grpo-v7")
        first = ledger.hand_off("grpo-v7", event_id="run-42/5/handoff")
        ledger.activate_evaluation("eval-v2")
        assert ledger.candidate("grpo-v7").state is State.RECEIVED
    with Ledger.open(target) as restarted:
        again = restarted.hand_off("grpo-v7", event_id="run-42/5/handoff")
        assert restarted.candidate("grpo-v7").state is State.RECEIVED
    assert first.state is State.READY and again.duplicate
    assert again.candidate == first.candidate and again.events == first.events


def test_a_retried_settings_command_answers_the_settings_it_left(ledger: Ledger) -> None:
    """As a candidate command's retry does: the settings as the first call left them, not as they are now."""
    ledger.init()
    first = ledger.activate_evaluation("eval-v1", event_id="K")
    ledger.activate_evaluation("eval-v2")
    again = ledger.activate_evaluation("eval-v1", event_id="K")
    assert again.duplicate and again.settings == first.settings and again.events == first.events
    assert again.settings.evaluation_version == "eval-v1" and ledger.settings().evaluation_version == "eval-v2"


def test_init_with_a_key_is_its_own_duplicate(ledger: Ledger) -> None:
    first = ledger.init(3, 1, event_id="k/init")
    again = ledger.init(3, 1, event_id="k/init")
    assert isinstance(again, SettingsResult) and again.duplicate and again.events == first.events
    assert [e.event_id for e in ledger.store.read_stream(LEDGER_STREAM)] == ["k/init"]


@pytest.mark.parametrize(
    ("key", "why"),
    [("run-7 ", "whitespace"), (" run-7", "whitespace"), ("cafe\u0301", "NFC"), ("run\x1b7", "control")],
)
def test_an_idempotency_key_is_held_to_the_candidate_id_rule(ledger: Ledger, key: str, why: str) -> None:
    """A key that prints like another key (a trailing space, NFD beside NFC) would be a second key for the
    same command: refused as such a candidate id is, before anything is appended."""
    with pytest.raises(InputError, match=why):
        ledger.init(event_id=key)
    assert ledger.store.head().seq == 0


def test_a_closed_ledger_raises_a_lifecycle_error(ws: Workspace) -> None:
    """Not sqlite3.ProgrammingError: every call on a closed ledger is LedgerClosedError; closing twice is fine."""
    ledger = ws.ledger()
    ledger.receive(ws.dpo())
    ledger.close()
    ledger.close()
    assert ledger.closed
    for call in (
        lambda: ledger.candidate("dpo-v5"),
        lambda: ledger.check("dpo-v5"),
        lambda: list(ledger.events()),
        ledger.settings,
        lambda: ledger.store.head(),  # noqa: PLW0108 (the store is looked up after close)
        ledger.seal,  # a closed ledger, not a missing signing key
        lambda: ledger.attest("dpo-v5"),
        ledger.follow,
    ):
        with pytest.raises(LedgerClosedError) as info:
            call()
        assert isinstance(info.value, LifecycleError)


def test_entering_a_closed_ledger_is_refused_at_once(ws: Workspace) -> None:
    """`with ledger:` on a ledger already closed (a supervisor re-using the object of a finished run)
    returned it as if open, and the block failed later at its first read or write, wherever that was;
    as with a closed file, entering it is refused (LedgerClosedError). A ledger closed inside its own
    block leaves it cleanly."""
    ledger = ws.ledger()
    with ledger:
        ledger.init()
    with pytest.raises(LedgerClosedError, match="closed"), ledger:
        pass
    with ws.ledger() as again:
        again.close()
    assert again.closed


def test_busy_timeout_reaches_sqlite(ws: Workspace) -> None:
    """A writer waits `busy_timeout` for another's lock: a short one gives up, a long one outlasts the holder."""
    with ws.ledger() as setup:
        setup.init()
    holder = sqlite3.connect(ws.db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Ledger.open(ws.db, busy_timeout=0.1) as impatient:
            started = time.monotonic()
            with pytest.raises(StoreError):
                impatient.advance_window(2)
        assert time.monotonic() - started < 10  # gave up after its own timeout, not the 30 s default
        release = threading.Timer(1.0, lambda: holder.execute("COMMIT"))
        release.start()
        with Ledger.open(ws.db, busy_timeout=30.0) as patient:
            started = time.monotonic()
            assert patient.advance_window(2).appended
            assert time.monotonic() - started > 0.5  # it did wait for the holder
        release.join()
    finally:
        holder.close()
