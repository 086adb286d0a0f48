"""How a training supervisor embeds the ledger (the README's example, run and type-checked by the tests).

Usage: python examples/embed.py LEDGER_DB SFT_MANIFEST GRPO_MANIFEST TRAJECTORIES_PATH
"""

from __future__ import annotations

import sys

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
        ledger.check(cid, event_id="run-42/4/check")
        return ledger.hand_off(cid, event_id="run-42/5/handoff").state  # State.READY, TUNE or REJECT


if __name__ == "__main__":
    print(supervise(*sys.argv[1:5]))  # ready | tune | reject
