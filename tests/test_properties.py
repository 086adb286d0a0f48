"""Property tests over the real Ledger on real SQLite files.

Hypothesis drives random command sequences (including refused ones) against a
small world of real adapters and manifests, built once per test function in
`tmp_path` (the world is never modified, so sharing it between examples is
safe); every example gets a fresh ledger file.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import Workspace
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from lifecycle_fsm.candidate_events import EVENT_TYPES
from lifecycle_fsm.errors import (
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    IllegalCommandError,
    InputError,
    NotFoundError,
)
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.machine import TABLE
from lifecycle_fsm.manifests import load_candidate_manifest
from lifecycle_fsm.replay import load_state, snapshot_json, take_checkpoint, verify
from lifecycle_fsm.results import CandidateResult, CommandResult
from lifecycle_fsm.rules import ONLINE_KINDS, STAGES, TRUSTED_STATE_KINDS
from lifecycle_fsm.store.base import verify_chain
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.sqlite import SQLiteEventStore

CIDS = ("dpo-v5", "grpo-v7", "rlvr-v1")
DECIDED = ("verified", "ready", "tune")
REFUSED = (IllegalCommandError, ConflictError, InputError, NotFoundError)
PROPERTY_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

Command = tuple[Any, ...]


class World:
    """Baselines, candidate manifests (original and revision per id) and trusted-state folders."""

    def __init__(self, root: Path) -> None:
        ws = Workspace(root)
        self.baselines = (ws.baseline("sft"), ws.baseline("sft2"))
        # dpo hands off as ready, grpo as tune (then may be revised), rlvr as reject (upstream).
        self.manifests = {
            "dpo-v5": (ws.dpo(), ws.dpo("dpo-v5-r1", policy_version="dpo-v5", evaluation_version="eval-v2")),
            "grpo-v7": (ws.grpo(decision="tune"), ws.grpo("grpo-v7-r1", policy_version="grpo-v7")),
            "rlvr-v1": (ws.rlvr(decision="reject"), ws.rlvr("rlvr-v1-r1", policy_version="rlvr-v1")),
        }
        self.trusted = (ws.adapter("trusted-a"), ws.adapter("trusted-b", size=1024))
        self.root = root
        self._dbs = itertools.count()

    def fresh_db(self) -> Path:
        return self.root / "ledgers" / f"ledger-{next(self._dbs)}.db"

    def open(self, db: Path | None = None) -> Ledger:
        path = db or self.fresh_db()
        path.parent.mkdir(parents=True, exist_ok=True)
        return Ledger.open(path, synchronous="NORMAL", clock=lambda: "2025-01-01T00:00:00.000000Z")


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


# --- commands ------------------------------------------------------------------

cids = st.sampled_from((*CIDS, *CIDS, "ghost"))
BRANCHES: dict[str, st.SearchStrategy[Command]] = {
    "receive": st.tuples(st.just("receive"), cids, st.integers(0, 1)),
    "check": st.tuples(st.just("check"), cids),
    "hand_off": st.tuples(st.just("hand_off"), cids),
    "fail_stage": st.tuples(st.just("fail_stage"), cids, st.sampled_from(STAGES)),
    "complete_recovery": st.tuples(st.just("complete_recovery"), cids),
    "record_trusted_state": st.tuples(
        st.just("record_trusted_state"), cids, st.sampled_from(TRUSTED_STATE_KINDS), st.integers(0, 1)
    ),
    "invalidate_trusted_state": st.tuples(
        st.just("invalidate_trusted_state"), cids, st.sampled_from(TRUSTED_STATE_KINDS)
    ),
    "activate_baseline": st.tuples(st.just("activate_baseline"), st.sampled_from((1, 1, 2))),
    "advance_window": st.tuples(st.just("advance_window"), st.integers(-1, 2)),
    "activate_evaluation": st.tuples(st.just("activate_evaluation"), st.sampled_from(("eval-v1", "eval-v2"))),
    "take_checkpoint": st.tuples(st.just("take_checkpoint"), st.none() | st.integers(0, 100)),
}
# Weighted towards the decided states (verified, ready, tune) that settings changes invalidate.
WEIGHTS = {"receive": 3, "check": 4, "hand_off": 3, "complete_recovery": 2, "record_trusted_state": 2}


def commands(*, max_size: int, min_size: int = 0, checkpoint_weight: int = 1) -> st.SearchStrategy[list[Command]]:
    """Random command lists; each name drawn with its weight, then its arguments."""
    weights = WEIGHTS | {"take_checkpoint": checkpoint_weight}
    names = [name for name in BRANCHES for _ in range(weights.get(name, 1))]
    one = st.sampled_from(names).flatmap(BRANCHES.__getitem__)
    setup = [("activate_baseline", 1), *(("receive", cid, 0) for cid in CIDS)]
    with_setup = st.sampled_from((True, True, True, False))
    return st.tuples(with_setup, st.lists(one, min_size=min_size, max_size=max_size)).map(
        lambda t: [*setup, *t[1]] if t[0] else t[1]
    )


def dispatch(world: World, ledger: Ledger, cmd: Command) -> CommandResult | None:
    name, *args = cmd
    if name == "receive":
        missing = world.root / "no-such-manifest.json"  # an unknown id has no manifest: InputError
        return ledger.receive(world.manifests[args[0]][args[1]] if args[0] in world.manifests else missing)
    if name == "record_trusted_state":
        return ledger.record_trusted_state(args[0], args[1], world.trusted[args[2]])
    if name == "activate_baseline":
        return ledger.activate_baseline(world.baselines[args[0] - 1])
    if name == "advance_window":
        return ledger.advance_window((ledger.settings().active_window or 1) + args[0])
    if name == "take_checkpoint":
        head = ledger.store.head().seq
        to = None if args[0] is None else head * args[0] // 100
        take_checkpoint(ledger.store, clock=lambda: "2025-01-01T00:00:00Z", to=to)
        return None
    result: CommandResult = getattr(ledger, name)(*args)
    return result


def run(world: World, ledger: Ledger, cmd: Command) -> bool:
    """Apply one command; a refusal must append nothing. True when it was accepted."""
    store = ledger.store
    before_count, before_settings = store.count_events(), ledger.settings()
    try:
        result = dispatch(world, ledger, cmd)
    except (ConcurrencyError, DuplicateEventError):
        raise  # one writer and no event ids: these would be bugs, not refusals
    except REFUSED:
        assert store.count_events() == before_count, f"refused {cmd} appended events"
        return False
    if result is None:
        assert store.count_events() == before_count, f"{cmd} appended events"
        return True
    assert store.count_events() == before_count + len(result.events), cmd
    if isinstance(result, CandidateResult):  # what the command returned is what the log now says
        assert result.candidate == ledger.candidate(result.candidate.candidate_id), cmd
    after = ledger.settings()
    changed = (
        after.active_policy_version != before_settings.active_policy_version
        or after.evaluation_version != before_settings.evaluation_version
    )
    online_only = after.active_window != before_settings.active_window
    if changed or online_only:  # a setting changed: no decided candidate may keep its old evidence
        for cid in ledger.candidate_ids():
            c = ledger.candidate(cid)
            assert not (c.state in DECIDED and (changed or c.kind in ONLINE_KINDS)), (cmd, cid, c.state)
    return True


def run_all(world: World, ledger: Ledger, cmds: list[Command]) -> None:
    accepted = sum(run(world, ledger, cmd) for cmd in cmds)
    event(f"accepted {accepted // 10 * 10}+ of {len(cmds) // 10 * 10}+ commands")
    states = sorted({ledger.candidate(cid).state for cid in ledger.candidate_ids()})
    event(f"states reached: {states}")


def backup(db: Path, dest: Path) -> Path:
    """A consistent copy of a live ledger file through sqlite3's backup API (WAL included)."""
    with sqlite3.connect(db) as src, sqlite3.connect(dest) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    return dest


# --- property 1: replay == live ------------------------------------------------


@PROPERTY_SETTINGS
@given(cmds=commands(min_size=15, max_size=40))
def test_replay_equals_the_live_per_stream_fold(world: World, cmds: list[Command]) -> None:
    """After any command sequence, full replay and checkpoint replay equal every stream's live fold."""
    with world.open() as ledger:
        run_all(world, ledger, cmds)
        store = ledger.store
        full = load_state(store, use_checkpoints=False).state
        live = {cid: ledger.candidate(cid) for cid in ledger.candidate_ids()}
        assert full.candidates == live
        assert full.settings == ledger.settings()
        assert full.position == store.head().seq
        assert load_state(store).state == full
        heads = {h.stream_id: h.version for h in store.streams()}  # the streams an invalidation fans out to
        assert {stream_of(cid): c.version for cid, c in live.items()}.items() <= heads.items()
        take_checkpoint(store, clock=lambda: "2026-01-01T00:00:00Z")  # the state index moves to the fold's
        labels = {h.stream_id: (h.version, h.status, h.category) for h in store.streams()}
        for cid, c in live.items():
            assert labels[stream_of(cid)] == (c.version, c.state, c.kind)
        assert verify_chain(store).ok
        assert verify(store)["ok"]


# --- property 2: checkpoint + tail == full replay, everywhere ---------------------


@PROPERTY_SETTINGS
@given(cmds=commands(min_size=10, max_size=30, checkpoint_weight=6))
def test_checkpoint_plus_tail_equals_full_replay_at_every_position(world: World, cmds: list[Command]) -> None:
    """For every position p, the latest usable checkpoint plus the tail folds to a full replay to p."""
    with world.open() as ledger:
        run_all(world, ledger, cmds)
        store = ledger.store
        positions = [c.position for c in store.select_checkpoints()]
        for p in range(store.head().seq + 1):
            loaded = load_state(store, to=p)
            full = load_state(store, to=p, use_checkpoints=False)
            assert loaded.state.position == full.state.position == p
            assert snapshot_json(loaded.state) == snapshot_json(full.state), p
            assert not loaded.skipped
            assert (loaded.checkpoint is not None) == any(q <= p for q in positions)


# --- property 3: the table guards every command ---------------------------------


def recipe(name: str, cid: str) -> list[Command]:
    """Commands that usually drive `cid` to a given state (the prefix may divert it)."""
    checked = [
        *(("activate_baseline", 1), ("activate_evaluation", "eval-v1"), ("receive", cid, 0)),
        *(("complete_recovery", cid), ("check", cid)),
    ]
    return {
        "received": [("receive", cid, 0)],
        "verified": checked,
        "handed_off": [*checked, ("hand_off", cid)],
        "revised": [*checked, ("hand_off", cid), ("receive", cid, 1)],
        "recovering": [("receive", cid, 0), ("fail_stage", cid, "sampling")],
        "recovered": [("receive", cid, 0), ("fail_stage", cid, "reward"), ("complete_recovery", cid)],
        "blocked": [("receive", cid, 0), ("fail_stage", cid, "update")],
    }[name]


def probes(cid: str, kinds: list[str]) -> list[tuple[Command, tuple[str, ...]]]:
    """Every candidate command, with the triggers it could fire."""
    kind = kinds[0] if kinds else "prompt_queue"
    return [
        (("check", cid), ("pass_checks", "fail_checks")),
        (("hand_off", cid), ("hand_off_ready", "hand_off_tune", "hand_off_reject")),
        *(
            (
                ("fail_stage", cid, stage),
                ("fail_artifact_validation" if stage == "artifact_validation" else "fail_stage",),
            )
            for stage in STAGES
        ),
        (("complete_recovery", cid), ("complete_recovery",)),
        (("record_trusted_state", cid, "prompt_queue", 1), ("record_trusted_state",)),
        (("invalidate_trusted_state", cid, kind), ("invalidate_trusted_state",)),
    ]


def _triggers_of(ledger: Ledger, cid: str, after: int) -> list[str]:
    events = [e for e in ledger.store.read_stream(stream_of(cid)) if e.seq > after]
    return [EVENT_TYPES[e.type].trigger_for(orjson.loads(e.payload)) or "" for e in events]


@PROPERTY_SETTINGS
@given(
    prefix=commands(max_size=10),
    cid=st.sampled_from(CIDS),
    target=st.sampled_from(("received", "verified", "handed_off", "revised", "recovering", "recovered", "blocked")),
)
@example(prefix=[], cid="dpo-v5", target="handed_off")  # ready
@example(prefix=[], cid="grpo-v7", target="handed_off")  # tune
@example(prefix=[], cid="rlvr-v1", target="handed_off")  # reject
@example(prefix=[], cid="grpo-v7", target="verified")
@example(prefix=[], cid="dpo-v5", target="recovering")
@example(prefix=[], cid="rlvr-v1", target="received")
def test_table_forbidden_commands_are_refused_and_allowed_ones_are_not(
    world: World, prefix: list[Command], cid: str, target: str
) -> None:
    """From any reachable state, a command the TABLE forbids raises IllegalCommandError and appends nothing."""
    db = world.fresh_db()
    with world.open(db) as ledger:
        run_all(world, ledger, [*prefix, *recipe(target, cid)])
        current = ledger.candidate(cid)
        state = current.state
        event(f"probed from {state}")
        head = ledger.store.count_events()
        allowed_probes = []
        for cmd, triggers in probes(cid, sorted(current.trusted_states)):
            if any((state, t) in TABLE for t in triggers):
                allowed_probes.append((cmd, triggers))
                continue
            with pytest.raises(IllegalCommandError) as refused:
                dispatch(world, ledger, cmd)
            assert refused.value.state == state
            assert ledger.store.count_events() == head, cmd
        for rev, manifest in enumerate(world.manifests[cid]):
            fields = load_candidate_manifest(manifest).fields
            if canonical_json(fields) == canonical_json(current.candidate):
                assert not ledger.receive(manifest).events  # identical re-receipt: a no-op in any state
            elif (state, "revise") in TABLE:
                allowed_probes.append((("receive", cid, rev), ("revise",)))
            else:  # the table forbids `revise` here: refused, nothing appended
                with pytest.raises(IllegalCommandError):
                    ledger.receive(manifest)
            assert ledger.store.count_events() == head
    for i, (cmd, triggers) in enumerate(allowed_probes):
        copy = backup(db, db.with_name(f"{db.stem}-probe{i}.db"))
        with world.open(copy) as probe:
            try:
                dispatch(world, probe, cmd)
            except IllegalCommandError as e:
                pytest.fail(f"{cmd} from {state}: the table allows {triggers} but the ledger refused: {e}")
            except (ConflictError, InputError):
                assert probe.store.count_events() == head, cmd  # e.g. no baseline, kind not recorded
                continue
            fired = _triggers_of(probe, cid, current.last_seq)
            assert fired, cmd
            assert fired[0] in triggers and (state, fired[0]) in TABLE, (cmd, state, fired)


def test_commands_on_an_unknown_candidate_are_not_found_and_append_nothing(world: World) -> None:
    """With no stream (the TABLE allows only receive) every other command is NotFoundError."""
    with world.open() as ledger:
        run(world, ledger, ("activate_baseline", 1))
        head = ledger.store.count_events()
        for cmd, _ in probes("ghost", []):
            with pytest.raises(NotFoundError):
                dispatch(world, ledger, cmd)
        assert ledger.store.count_events() == head


# --- property 4: determinism ----------------------------------------------------


@PROPERTY_SETTINGS
@given(cmds=commands(min_size=10, max_size=30, checkpoint_weight=3))
def test_replay_is_byte_identical_across_runs_and_copies(world: World, cmds: list[Command]) -> None:
    """Replaying one file twice, or a copy of it elsewhere, gives the same snapshot bytes."""
    db = world.fresh_db()
    with world.open(db) as ledger:
        run_all(world, ledger, [*cmds, ("take_checkpoint", None)])
        first = snapshot_json(load_state(ledger.store, use_checkpoints=False).state)
        assert snapshot_json(load_state(ledger.store, use_checkpoints=False).state) == first
        assert snapshot_json(load_state(ledger.store).state) == first
        head = ledger.store.head()
    other = world.root / "copies" / f"{db.stem}"
    other.mkdir(parents=True)
    shutil.copyfile(db, other / "copy.db")  # closed: the WAL is folded back into the file
    backed_up = backup(db, other / "backup.db")
    for path in (db, other / "copy.db", backed_up):
        with SQLiteEventStore(path, synchronous="NORMAL") as store:
            assert store.head() == head
            assert snapshot_json(load_state(store, use_checkpoints=False).state) == first
            loaded = load_state(store)
            assert loaded.checkpoint is not None and not loaded.skipped
            assert snapshot_json(loaded.state) == first
            assert verify(store)["ok"]
