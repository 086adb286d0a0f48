"""How a training supervisor embeds the ledger (the docs' example, run and type-checked by the tests).

Usage: python examples/embed.py LEDGER_DB SFT_MANIFEST GRPO_MANIFEST TRAJECTORIES_PATH
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lifecycle_fsm
from lifecycle_fsm import Ledger, RecoveryAction, State


def supervise(db: str, sft_manifest: str, grpo_manifest: str, trajectories: str) -> State:
    """Receive a GRPO candidate, survive a reward-stage failure, and hand it off."""
    with Ledger.open(db, actor="supervisor-7", busy_timeout=30.0) as ledger:
        ledger.init(event_id="run-42/0/init")
        ledger.activate_baseline(sft_manifest, event_id="run-42/0/baseline")
        cid = ledger.receive(grpo_manifest, event_id="run-42/1/receive").candidate_id
        ledger.record_trusted_state(cid, "trajectories", trajectories, event_id="run-42/2/trusted")
        plan = ledger.fail_stage(cid, "reward", event_id="run-42/3/fail").plan
        if plan.action is RecoveryAction.RESUME_REWARD_FROM_SAVED_TRAJECTORIES:
            print(f"reuse {plan.path} (sha256 {plan.sha256})")
        print(plan.action)  # resume_reward_from_saved_trajectories
        ledger.complete_recovery(cid, event_id="run-42/3/recovered")
        if ledger.check(cid, event_id="run-42/4/check").state is State.REJECT:
            return State.REJECT  # a hard check failed: reject is final, there is nothing to hand off
        return ledger.hand_off(cid, event_id="run-42/5/handoff").state  # State.READY, TUNE or REJECT


def main(argv: list[str] | None = None) -> int:
    """Run `supervise` on the command line's four paths; a wrong argument count prints the usage (exit 2)."""
    parser = argparse.ArgumentParser(
        description="Receive a GRPO candidate, survive a reward-stage failure, and hand it off "
        "(docs/embedding.md). Prints the hand-off state: ready, tune or reject."
    )
    parser.add_argument("db", metavar="LEDGER_DB", help="the ledger file (or a postgresql:// URL)")
    parser.add_argument("sft_manifest", metavar="SFT_MANIFEST", help="the SFT baseline's manifest")
    parser.add_argument("grpo_manifest", metavar="GRPO_MANIFEST", help="the GRPO candidate's manifest")
    parser.add_argument("trajectories", metavar="TRAJECTORIES_PATH", help="the saved trajectories to trust")
    args = parser.parse_args(argv)
    for name in ("sft_manifest", "grpo_manifest", "trajectories"):
        if not Path(getattr(args, name)).is_file():  # before the ledger is opened: nothing is written
            parser.error(f"{name.upper()} {getattr(args, name)}: no such file")
    try:
        state = supervise(args.db, args.sft_manifest, args.grpo_manifest, args.trajectories)
    except lifecycle_fsm.LifecycleError as e:  # e.g. run-42's keys used already by another candidate
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(state)  # ready | tune | reject
    return 0


if __name__ == "__main__":
    sys.exit(main())
