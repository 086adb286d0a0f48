"""A training supervisor on the ledger: a simulated post-training loop, crash and restart included.

Usage: python examples/supervisor_loop.py WORKDIR [--db DB] [--seed N] [--run NAME] [--crash-after K]

Two candidates (a DPO and a GRPO policy branched from one SFT baseline) go through
the seed's stages: prompt queue -> sampling -> reward -> update -> artifact validation.
Every stage writes real files, and each trusted state (the prompt queue, the saved
trajectories, the pre-update checkpoint) is recorded in the ledger as it is saved.
Failures are injected at stages chosen by the seed; the supervisor reports each one,
follows the typed plan the ledger returns (`plan.action`, resuming from `plan.path`
after checking `plan.sha256`), and finally checks and hands each candidate off.

The supervisor runs in a child process. With `--crash-after K` (default: chosen by the
seed; 0 for none) that child dies right after its K-th acknowledged command, and this
parent starts it again once. The restarted child runs the loop from the beginning:
every command carries an idempotency key `<run>/<step>/<command>`, so the commands
the first child already recorded append nothing, and the loop picks up where it died.
Running the whole example again on the same ledger and run name appends nothing.

The adapters the manifests name are written up front (a stand-in for the trainer's
export); the loop never modifies them, so their hand-off checks pass.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from lifecycle_fsm import Ledger, RecoveryAction, RecoveryPlan, State, hash_directory
from lifecycle_fsm.manifests import write_manifest
from lifecycle_fsm.replay.drills.workspace import baseline_manifest, candidate_manifest, write_adapter

STAGES = ("sampling", "reward", "update", "artifact_validation")
CRASHED = 75  # the child's exit code when it kills itself on purpose
# Where the loop resumes after each plan (an index into STAGES), and whether the prompt queue must be rebuilt.
RESUME: dict[RecoveryAction, tuple[int, bool]] = {
    RecoveryAction.RETRY_SAMPLING_FROM_PROMPT_QUEUE: (0, False),
    RecoveryAction.REBUILD_PROMPT_QUEUE: (0, True),
    RecoveryAction.RESUME_REWARD_FROM_SAVED_TRAJECTORIES: (1, False),
    RecoveryAction.RESTART_SAMPLING_FROM_PROMPT_QUEUE: (0, False),
    RecoveryAction.RESTART_SAMPLING: (0, True),
    RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT: (2, False),
    RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE: (2, False),
}


class Supervisor:
    """One supervisor process: numbers its commands, keys them, and may crash on purpose."""

    def __init__(self, ledger: Ledger, run: str, crash_after: int) -> None:
        self.ledger = ledger
        self.run = run
        self.crash_after = crash_after
        self.step = 0

    def key(self, command: str) -> str:
        """The next command's idempotency key: `<run>/<step>/<command>`, the same on every replay."""
        self.step += 1
        return f"{self.run}/{self.step:04d}/{command}"

    def acknowledged(self) -> None:
        """Called after each command returned: the place a crash loses the most (the reply)."""
        if self.step == self.crash_after:
            print(f"supervisor: crashing after command {self.step}", flush=True)
            os._exit(CRASHED)


def write_jsonl(path: Path, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(row + "\n" for row in rows))
    return path


def follow(sup: Supervisor, cid: str, plan: RecoveryPlan) -> tuple[int, bool]:
    """Check the state the plan reuses is the one recorded, and say where to resume."""
    if plan.path is not None:
        assert hash_directory(plan.path) == plan.sha256, f"{plan.path} changed since the plan"
    for kind, reason in plan.skipped:
        print(f"  {cid}: passed over {kind} ({reason})")
    print(f"  {cid}: {plan.stage} failed -> {plan.action} (reuse {plan.recovery_state or 'nothing'})")
    return RESUME[plan.action]


def train(sup: Supervisor, cid: str, home: Path, failing: set[str], corrupt: bool) -> None:
    """The post-training stages for one candidate, each failure recovered as the ledger plans.

    With `corrupt`, a failing reward stage also garbles the saved trajectories on disk:
    the plan must pass them over (`hash_changed`) and restart from the prompt queue.
    """
    ledger, stage, rebuild, attempt = sup.ledger, 0, True, 0
    while stage < len(STAGES):
        attempt += 1
        name = STAGES[stage]
        if rebuild:  # the prompt queue: the first trusted state of a round
            queue = write_jsonl(home / "prompt_queue.jsonl", [f'{{"prompt": {i}}}' for i in range(8)])
            ledger.record_trusted_state(cid, "prompt_queue", queue, event_id=sup.key("trusted-prompt_queue"))
            sup.acknowledged()
            rebuild = False
        if name == "update":  # save the optimizer state before stepping: the update's trusted state
            checkpoint = write_adapter(home / "pre_update", f"{cid}-pre-update", b"optimizer-state")
            ledger.record_trusted_state(cid, "pre_update_checkpoint", checkpoint, event_id=sup.key("trusted-ckpt"))
            sup.acknowledged()
        if name in failing:  # the stage fails midway (once): report it, get the plan, follow it
            failing.discard(name)
            if name == "reward" and corrupt:
                (home / "trajectories.jsonl").write_text("truncated by a full disk")
            result = ledger.fail_stage(cid, name, event_id=sup.key(f"fail-{name}"))
            sup.acknowledged()
            if result.plan.blocking:
                print(f"  {cid}: {name} failed -> {result.plan.action}: blocked ({result.state})")
                return
            stage, rebuild = follow(sup, cid, result.plan)
            ledger.complete_recovery(cid, event_id=sup.key("recovered"))
            sup.acknowledged()
            continue
        if name == "sampling":
            rows = [f'{{"prompt": {i}, "completion": "c{i}-{attempt}"}}' for i in range(8)]
            saved = write_jsonl(home / "trajectories.jsonl", rows)
            ledger.record_trusted_state(cid, "trajectories", saved, event_id=sup.key("trusted-trajectories"))
            sup.acknowledged()
        elif name == "reward":
            write_jsonl(home / "rewards.jsonl", [f'{{"prompt": {i}, "reward": {i % 3}}}' for i in range(8)])
        stage += 1


def supervise(workdir: Path, db: str, seed: int, run: str, crash_after: int) -> dict[str, State]:
    """The whole run; returns each candidate's hand-off state."""
    rng = random.Random(seed)
    sft_sha = hash_directory(write_adapter(workdir / "sft" / "adapter", "sft", rng.randbytes(4096)))
    sft = write_manifest(workdir / "sft" / "manifest.json", baseline_manifest(sft_sha))
    outcomes: dict[str, State] = {}
    with Ledger.open(db, actor=f"supervisor:{run}") as ledger:
        sup = Supervisor(ledger, run, crash_after)
        ledger.init(event_id=sup.key("init"))
        sup.acknowledged()
        ledger.activate_baseline(sft, event_id=sup.key("baseline"))
        sup.acknowledged()
        for kind in ("dpo", "grpo"):
            cid = f"{kind}-{run}"
            home = workdir / cid
            sha = hash_directory(write_adapter(home / "adapter", cid, rng.randbytes(4096)))
            fields = candidate_manifest(kind, source_policy_version=sft_sha, policy_version=cid, adapter_sha256=sha)
            manifest = write_manifest(home / "manifest.json", fields)
            ledger.receive(manifest, event_id=sup.key("receive"))
            sup.acknowledged()
            # Non-blocking failures only (the SFT adapter stays intact, so a rollback is always possible).
            failing = set(rng.sample(STAGES, k=rng.randint(1, 3)))
            train(sup, cid, home, failing, corrupt=rng.random() < 0.5)
            checked = ledger.check(cid, event_id=sup.key("check"))
            sup.acknowledged()
            if checked.state is State.REJECT:  # a hard check failed (another baseline, a broken adapter): final
                outcomes[cid] = checked.state
            else:
                outcomes[cid] = ledger.hand_off(cid, event_id=sup.key("handoff")).state
            sup.acknowledged()
            print(f"{cid}: {outcomes[cid]}", flush=True)
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--db", help="ledger file or postgresql:// URL (default: WORKDIR/lifecycle.db)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--run", default="run1")
    parser.add_argument("--crash-after", type=int, help="crash the first child after its K-th command (0: never)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.child:  # the same seed again appends nothing; another would rewrite this run's files under it
        setup = args.workdir / "example.json"
        if not setup.exists():
            setup.write_text(json.dumps({"seed": args.seed}))
        elif (earlier := json.loads(setup.read_text())["seed"]) != args.seed:
            parser.error(f"{args.workdir} was set up with --seed {earlier}: run that seed again, or use a new folder")
    db = args.db or str(args.workdir / "lifecycle.db")
    crash_after = random.Random(args.seed).randint(3, 12) if args.crash_after is None else args.crash_after
    if args.child:
        outcomes = supervise(args.workdir, db, args.seed, args.run, crash_after)
        return 0 if all(s in (State.READY, State.TUNE) for s in outcomes.values()) else 1
    base = [sys.executable, __file__, str(args.workdir), "--db", db, "--seed", str(args.seed), "--run", args.run]
    first = subprocess.run([*base, "--child", "--crash-after", str(crash_after)], check=False)
    if first.returncode != CRASHED:
        return first.returncode
    print("supervisor: restarted", flush=True)
    return subprocess.run([*base, "--child", "--crash-after", "0"], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
