"""A child process that runs a command plan against a ledger and acknowledges each command.

    python tests/reliability/child.py DB PLAN.json ACKS.jsonl [GO-FILE]

The acknowledgements go to their own file, fsynced after each command, so the test
knows exactly which commands a killed child had finished. With GO-FILE the child
waits for that file to exist first (so concurrent writers start together).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from workload import ack, run_command  # noqa: E402

from lifecycle_fsm.ledger import Ledger  # noqa: E402


def main() -> None:
    db, plan_path, acks_path = sys.argv[1:4]
    plan = json.loads(Path(plan_path).read_text())
    if len(sys.argv) > 4:
        go = Path(sys.argv[4])
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
    with open(acks_path, "a", encoding="utf-8") as fh, Ledger.open(db, synchronous="FULL", actor="child") as ledger:
        for cmd in plan:
            if cmd.get("pause"):
                time.sleep(cmd["pause"])
            if cmd.get("fault"):  # this command's own store dies at its first commit's fault point
                os.environ["LIFECYCLE_FAULT"] = f"kill@{cmd['fault']}#1"
                with Ledger.open(db, synchronous="FULL", actor="child") as doomed:
                    ack(fh, run_command(doomed, cmd))
                del os.environ["LIFECYCLE_FAULT"]
                continue
            ack(fh, run_command(ledger, cmd))


if __name__ == "__main__":
    main()
