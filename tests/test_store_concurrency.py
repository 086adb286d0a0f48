"""Many real processes on one ledger, on every durable backend (an SQLite file, a PostgreSQL schema).

The follower test is the one a bare-sequence design fails: writers that commit late
must never let a reader polling `seq > last` skip a position (benchmarks/bench_postgres.py
measures how many a bare `bigserial` skips under the same load).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from backends import DURABLE, Backend, backend_params, make_backend
from conftest import Workspace

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import verify
from lifecycle_fsm.replay.report import build_report
from lifecycle_fsm.store import EventFilter, StoredEvent
from lifecycle_fsm.store.base import select_events, verify_chain

REPO = Path(__file__).resolve().parent.parent
WRITERS = 8
PER_WRITER = 40


@pytest.fixture(params=backend_params(DURABLE))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )


_RACER = """
import json, pathlib, sys, time
from lifecycle_fsm.store import ConcurrencyError, NewEvent
from lifecycle_fsm.store.open import open_store
target, me, sync = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
store = open_store(target, synchronous="NORMAL")
seen = store.stream_version("race")
(sync / me).touch()
deadline = time.monotonic() + 60
while len(list(sync.iterdir())) < 2:
    if time.monotonic() > deadline:
        sys.exit("the other racer never arrived")
    time.sleep(0.002)
event = NewEvent("race", "Happened", 1, {"who": me}, "id-" + me, "2024-01-01T00:00:00Z", me)
try:
    result = store.append("race", seen, [event])
    print(json.dumps({"won": True, "seen": seen, "seq": result.events[0].seq}))
except ConcurrencyError as e:
    print(json.dumps({"won": False, "seen": seen, "expected": e.expected_version, "actual": e.actual_version}))
"""


def test_two_processes_race_for_one_version(backend: Backend, tmp_path: Path) -> None:
    """Two real processes both read version 0 and append at it: exactly one wins, one row lands."""
    backend.open().close()  # create the ledger first
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [_spawn(_RACER, str(backend.target), me, str(sync)) for me in ("p1", "p2")]
    outcomes = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outcomes.append(json.loads(out))
    assert [o["seen"] for o in outcomes] == [0, 0]
    winners = [o for o in outcomes if o["won"]]
    losers = [o for o in outcomes if not o["won"]]
    assert len(winners) == 1 and len(losers) == 1
    assert winners[0]["seq"] == 1
    assert (losers[0]["expected"], losers[0]["actual"]) == (0, 1)
    store = backend.open()
    assert store.count_events() == 1
    store.close()


_WRITER = """
import pathlib, random, sys, time
from lifecycle_fsm.store import NewEvent
from lifecycle_fsm.store.open import open_store
target, me, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), pathlib.Path(sys.argv[4])
store = open_store(target, synchronous="NORMAL")
rng = random.Random(me)
(go.parent / ("ready-" + me)).touch()
while not go.exists():
    time.sleep(0.001)
for k in range(n):
    event = NewEvent("w" + me, "Wrote", 1, {"k": k}, f"{me}-{k}", "2024-01-01T00:00:00Z", "w" + me)
    if int(me) % 2:  # the one-message append (PostgreSQL: chained by the server under the lock)
        store.append("w" + me, k, [event])
        continue
    with store.transaction() as tx:
        tx.append("w" + me, k, [event])
        time.sleep(rng.uniform(0, 0.003))  # commit late: the moment a bare sequence lets a reader skip
store.close()
print(n)
"""


@pytest.mark.slow
def test_a_follower_sees_every_seq_once_in_order_while_8_processes_write(backend: Backend, tmp_path: Path) -> None:
    """8 writer processes (half of them commit late on purpose, half use `store.append`) while a reader
    polls `select_events(after=last)`.

    The reader must see seq 1, 2, 3, … with no gap and no repeat, and in the end every
    event the writers appended.
    """
    reader = backend.open()
    go = tmp_path / "go"
    procs = [_spawn(_WRITER, str(backend.target), str(i), str(PER_WRITER), str(go)) for i in range(WRITERS)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < WRITERS:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "writers did not start"
        time.sleep(0.005)
    go.touch()
    seen: list[StoredEvent] = []
    total = WRITERS * PER_WRITER
    polls = 0
    while len(seen) < total:
        assert time.monotonic() < deadline, f"reader saw {len(seen)} of {total}"
        last = seen[-1].seq if seen else 0
        for event in select_events(reader, EventFilter(after=last)):
            assert event.seq == len(seen) + 1, f"reader skipped or repeated: got seq {event.seq} after {last}"
            seen.append(event)
        polls += 1
        if any(p.poll() not in (None, 0) for p in procs):
            break
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert [e.seq for e in seen] == list(range(1, total + 1))
    assert {e.event_id for e in seen} == {f"{i}-{k}" for i in range(WRITERS) for k in range(PER_WRITER)}
    assert polls > WRITERS  # it really followed while they wrote, not once at the end
    assert verify_chain(reader).ok
    reader.close()


# A commit every millisecond or so: many land inside each read below, while the ledger stays small
# enough that each `verify` (a full replay) does not grow with an unpaced writer's thousands of events.
_TRUSTING = """
import pathlib, sys, time
from lifecycle_fsm import Ledger
target, ids, artifact, stop = sys.argv[1], sys.argv[2].split(","), sys.argv[3], pathlib.Path(sys.argv[4])
n = 0
with Ledger.open(target, synchronous="NORMAL", actor="writer") as ledger:
    while not stop.exists():
        ledger.record_trusted_state(ids[n % len(ids)], "trajectories", artifact)
        n += 1
        time.sleep(0.001)
print(n)
"""


def test_verify_and_report_hold_while_another_process_writes(backend: Backend, ws: Workspace, tmp_path: Path) -> None:
    """`verify` compares its fold with the state index, a report puts the head beside every
    candidate's state: each reads the ledger in one snapshot, so a writer committing between
    two of their queries never makes a sound ledger look broken (before, with the writer below:
    "state index (streams) differs from a full replay", exit 6, on every `lifecycle verify`)."""
    ledger = Ledger(backend.open(), actor="setup")
    ledger.activate_baseline(ws.baseline())
    ids = [ledger.receive(ws.grpo(f"grpo-{i:02d}")).candidate_id for i in range(40)]
    artifact = tmp_path / "trajectories.bin"
    artifact.write_bytes(b"trajectories")
    stop = tmp_path / "stop"
    writer = _spawn(_TRUSTING, str(backend.target), ",".join(ids), str(artifact), str(stop))
    try:
        start = ledger.store.count_events()
        deadline = time.monotonic() + 60
        while ledger.store.count_events() < start + 20:  # the writer is committing
            assert writer.poll() is None and time.monotonic() < deadline, writer.communicate()
            time.sleep(0.01)
        heads = set()
        for _ in range(15):
            checked = verify(ledger.store)
            assert checked["ok"], checked["reason"]
            doc = build_report(ledger.store).to_json()
            assert doc["verify"]["ok"] and doc["trusted"], doc["verify"]
            assert {c["as_of"] for c in doc["candidates"].values()} == {doc["head"]["seq"]}
            heads.add(doc["head"]["seq"])
        cli = subprocess.run(
            [sys.executable, "-m", "lifecycle_fsm", "--db", str(backend.target), "--json", "verify"],
            check=False,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert len(heads) > 5  # the ledger really moved under the reads
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
        ledger.close()
    assert writer.returncode == 0, err
    assert int(out) > 20


_KEYED_RACER = """
import json, pathlib, sys, time
from lifecycle_fsm import Ledger
target, me, sync, racers = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), int(sys.argv[4])
with Ledger.open(target, synchronous="NORMAL", actor="racer-" + me) as ledger:
    (sync / me).touch()
    deadline = time.monotonic() + 60
    while len(list(sync.iterdir())) < racers:
        if time.monotonic() > deadline:
            sys.exit("the other racers never arrived")
        time.sleep(0.002)
    result = ledger.activate_evaluation("eval-v2", event_id="K")
    print(json.dumps({"events": [e.seq for e in result.events], "invalidated": list(result.invalidated)}))
"""


@pytest.mark.parametrize("setup", ["two-verified-candidates", "uninitialised"])
def test_racing_retries_of_one_keyed_command_all_answer_what_it_did(
    backend: Backend, ws: Workspace, tmp_path: Path, setup: str
) -> None:
    """Several processes run the same keyed settings command at once (a supervisor and its retry):
    one appends, every other answers as a retry with all it did — its fan-out to other streams too.
    Before: the losers said `invalidated: []` with only the first event, and on a ledger nobody had
    initialised most of them failed with DuplicateEventError."""
    if setup == "two-verified-candidates":
        with Ledger(backend.open(), actor="setup") as ledger:
            ledger.activate_baseline(ws.baseline())
            for manifest in (ws.dpo(), ws.grpo()):
                ledger.check(ledger.receive(manifest).candidate_id)
    else:
        backend.open().close()  # the schema only: the ledger's first event is the racers'
    sync = tmp_path / "sync"
    sync.mkdir()
    racers = 6
    procs = [_spawn(_KEYED_RACER, str(backend.target), str(i), str(sync), str(racers)) for i in range(racers)]
    answers = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        answers.append(json.loads(out))
    # On a ledger nobody initialised the winner also lists the default `LedgerInitialized` it
    # appended (seq 1, keyed at random: not the command's); a retry answers the keyed events.
    keyed = [{**a, "events": [seq for seq in a["events"] if setup != "uninitialised" or seq != 1]} for a in answers]
    assert all(a == keyed[0] for a in keyed), answers
    if setup == "two-verified-candidates":
        assert sorted(answers[0]["invalidated"]) == ["dpo-v5", "grpo-v7"] and len(answers[0]["events"]) == 3
    store = backend.open()
    try:
        assert verify(store)["ok"]
    finally:
        store.close()
