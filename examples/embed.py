"""How a training supervisor embeds the ledger (the README's example, run by the tests).

Usage: python examples/embed.py LEDGER_DB SFT_MANIFEST GRPO_MANIFEST TRAJECTORIES_PATH
"""

from __future__ import annotations

import sys

from lifecycle_fsm import Ledger


def supervise(db: str, sft_manifest: str, grpo_manifest: str, trajectories: str) -> str:
    """Receive a GRPO candidate, survive a reward-stage failure, and hand it off."""
    with Ledger.open(db, actor="supervisor-7") as ledger:
        ledger.init()
        ledger.activate_baseline(sft_manifest)
        candidate = ledger.receive(grpo_manifest).candidate
        assert candidate is not None
        cid = candidate.candidate_id
        ledger.record_trusted_state(cid, "trajectories", trajectories)
        failed = ledger.fail_stage(cid, "reward").candidate
        assert failed is not None
        assert failed.last_recovery is not None
        print(failed.last_recovery["action"])  # resume_reward_from_saved_trajectories
        ledger.complete_recovery(cid)
        ledger.check(cid)
        state = ledger.hand_off(cid).state
        assert state is not None
        return state


if __name__ == "__main__":
    print(supervise(*sys.argv[1:5]))  # ready | tune | reject
