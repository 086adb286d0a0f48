"""PostgreSQL under faults: backends terminated during keyed appends and during a follow, writers SIGKILLed.

The ledger runs as a login role of its own, so the server-side kills
(`pg_terminate_backend`) reach its sessions only, never another test's. Afterwards:
every acknowledged event is in the log exactly once, the seqs are 1..N with no gap,
the chain verifies, and every failure the writers met was a one-line StoreError.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import PG_BASE, pg_execute, require_postgres, with_schema
from conftest import REPO

from lifecycle_fsm.errors import StoreError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.store.base import select_events, verify_chain
from reliability.test_crash_consistency import CHILD
from reliability.workload import make_artifacts, own_candidates, writer_plan


@pytest.fixture
def role_url() -> Iterator[tuple[str, str]]:
    """(role, URL): a login role owning a fresh schema, and a URL that connects as it."""
    require_postgres()
    role, schema = f"lifecycle_rel_{uuid.uuid4().hex[:8]}", f"rel_{uuid.uuid4().hex[:12]}"
    pg_execute(PG_BASE, f"CREATE ROLE {role} LOGIN; CREATE SCHEMA {schema} AUTHORIZATION {role}")
    try:
        yield role, with_schema(PG_BASE.replace("://postgres@", f"://{role}@"), schema)
    finally:
        pg_execute(PG_BASE, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        pg_execute(PG_BASE, f"DROP SCHEMA {schema} CASCADE; DROP OWNED BY {role} CASCADE; DROP ROLE {role}")


class Killer(threading.Thread):
    """Terminates every backend of `role` at random intervals until stopped; counts what it ended."""

    def __init__(self, role: str, seed: int, every: tuple[float, float] = (0.02, 0.08)) -> None:
        super().__init__(daemon=True)
        self.role, self.rng, self.every = role, random.Random(seed), every
        self.halt = threading.Event()
        self.kills = 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(PG_BASE, autocommit=True) as conn:
            while not self.halt.wait(self.rng.uniform(*self.every)):
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = %s", (self.role,)
                ).fetchone()
                self.kills += row[0] if row else 0

    def __enter__(self) -> Killer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join()


def _keyed_window(ledger: Ledger, n: int, errors: Counter[str]) -> None:
    """`window n` keyed `k<n>`, repeated with the same key after each lost connection (a safe retry)."""
    for _ in range(200):
        try:
            ledger.advance_window(n, event_id=f"k{n}")
            return
        except StoreError as e:
            errors[_reason(e)] += 1
    raise AssertionError(f"window {n} never went through")


def _reason(error: StoreError) -> str:
    """What a refusal says after the ledger's URL (one line, as every error the store raises)."""
    text = str(error)
    assert "\n" not in text and "Traceback" not in text, text
    return text.split(": ", 2)[1].split(" (", maxsplit=1)[0]


def _check_log(url: str) -> list[Any]:
    with Ledger.open(url, create=False) as ledger:
        events = list(select_events(ledger.store))
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), "a seq gap"
        assert max(Counter(e.event_id for e in events).values()) == 1, "an event id stored twice"
        assert verify_chain(ledger.store).ok
        assert ledger.store.history_problem() is None
    return events


def test_keyed_appends_survive_terminated_backends(role_url: tuple[str, str], tally: list[dict[str, Any]]) -> None:
    role, url = role_url
    commands, errors = 80, Counter[str]()
    with Ledger.open(url, actor="rel") as ledger:
        ledger.init(event_id="init")
        with Killer(role, seed=1) as killer:
            for n in range(2, 2 + commands):
                _keyed_window(ledger, n, errors)
    events = _check_log(url)
    keyed = [e.event_id for e in events if e.type == "WindowAdvanced"]
    assert keyed == [f"k{n}" for n in range(2, 2 + commands)], "an acknowledged window is missing or doubled"
    assert killer.kills > 0
    tally.append(_row("postgres: backends terminated during keyed appends", commands, killer.kills, errors))


_FOLLOWED_WRITER = """
import sys
from lifecycle_fsm.errors import StoreError
from lifecycle_fsm.ledger import Ledger
url, count = sys.argv[1], int(sys.argv[2])
for _ in range(200):  # opening is a session too: ended while it starts, it is started again
    try:
        ledger = Ledger.open(url, actor="writer", create=False)
        break
    except StoreError:
        continue
with ledger:
    for n in range(2, 2 + count):
        for _ in range(200):
            try:
                ledger.advance_window(n, event_id=f"k{n}")
                break
            except StoreError:
                continue
"""


def test_a_follower_sees_every_event_in_order_while_backends_are_terminated(
    role_url: tuple[str, str], tally: list[dict[str, Any]]
) -> None:
    role, url = role_url
    commands, errors, seen = 60, Counter[str](), []
    with Ledger.open(url, actor="follower") as ledger:
        ledger.init(event_id="init")
        writer = subprocess.Popen(
            [sys.executable, "-c", _FOLLOWED_WRITER, url, str(commands)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        with Killer(role, seed=2) as killer:
            while len(seen) < commands + 1 and time.monotonic() < deadline:
                stop = threading.Event()
                try:
                    for event in ledger.follow(after=seen[-1] if seen else 0, poll=0.05, stop=stop):
                        seen.append(event.seq)
                        if len(seen) == commands + 1:
                            stop.set()
                except StoreError as e:  # the follow's session was ended: follow again after the last seen
                    errors[f"follow: {_reason(e)}"] += 1
        _, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err
    assert seen == list(range(1, commands + 2)), "the follower skipped, repeated or reordered an event"
    assert len(_check_log(url)) == commands + 1
    tally.append(_row("postgres: backends terminated during follow", commands, killer.kills, errors))


def test_writer_processes_killed_lose_no_acknowledged_event(
    role_url: tuple[str, str], tally: list[dict[str, Any]], tmp_path: Path, campaign: Any
) -> None:
    _, url = role_url
    writers, count, shared = 4, min(campaign.writer_commands, 40), ("dpo-a", "grpo-a")
    own = tuple(c for me in range(writers) for c in own_candidates(me, count))
    art = make_artifacts(tmp_path / "art", extra_candidates=own)
    with Ledger.open(url, actor="setup") as ledger:
        ledger.init(2, 1)
        ledger.activate_baseline(art.baselines["sft"])
        for name in shared:
            ledger.receive(art.candidates[name])
    go, procs = tmp_path / "go", []
    for me in range(writers):
        plan = tmp_path / f"plan-{me}.json"
        plan.write_text(json.dumps(writer_plan(11, me, count, art, shared)))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(CHILD), url, str(plan), str(tmp_path / f"acks-{me}.jsonl"), str(go)],
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    go.touch()
    rng, killed = random.Random(3), 0
    acks = [tmp_path / f"acks-{me}.jsonl" for me in range(writers)]
    for _ in range(2):  # two writers SIGKILLed at random moments once writing, mid-command or between commands
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(a.exists() and a.stat().st_size for a in acks):
            time.sleep(0.02)
        time.sleep(rng.uniform(0.05, 0.5))
        alive = [p for p in procs if p.poll() is None]
        if alive:
            rng.choice(alive).send_signal(signal.SIGKILL)
            killed += 1
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode in (0, -signal.SIGKILL), err
    events = _check_log(url)
    by_seq = {e.seq: e.event_id for e in events}
    lost = acked = 0
    for path in acks:
        for line in path.read_text().splitlines() if path.exists() else ():  # none: killed before it wrote
            try:
                ack = json.loads(line)
            except json.JSONDecodeError:  # the line a kill cut short: not an acknowledgement
                continue
            if ack["ok"]:
                acked += 1
                lost += sum(by_seq.get(s) != i for s, i in zip(ack["seqs"], ack["ids"], strict=True))
            else:
                assert ack["exit"] in (3, 4, 5), ack
    assert lost == 0 and acked > 0
    tally.append(
        {
            "campaign": "postgres: writer processes SIGKILLed",
            "backend": "postgres",
            "filesystem": "the server's data directory",
            "runs": writers,
            "faults": killed,
            "acked_commands": acked,
            "lost": lost,
            "wrong": 0,
            "result": "pass",
        }
    )


def _row(campaign: str, commands: int, kills: int, errors: Counter[str]) -> dict[str, Any]:
    return {
        "campaign": campaign,
        "backend": "postgres",
        "filesystem": "the server's data directory",
        "runs": 1,
        "commands": commands,
        "faults": kills,
        "refusals": dict(errors),
        "lost": 0,
        "wrong": 0,
        "result": "pass",
    }
