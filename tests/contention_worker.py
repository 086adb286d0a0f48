"""One supervisor process of the contention test: N mixed commands, shared and own candidates.

Usage: python tests/contention_worker.py TARGET WORKER N SEED FILES_DIR
Opens the ledger, then waits for FILES_DIR/go before its first command, so every worker
starts together however long the others took to start (a loaded machine skews starts
by seconds, and a worker that starts late can find the shared candidate already rejected).
Prints one JSON line: {"appended": events this process appended, "refused": count}.
A ConcurrencyError (or anything unexpected) escapes as a traceback and a non-zero exit.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from lifecycle_fsm import IllegalCommandError, InputError, Ledger


def main(target: str, worker: int, n: int, seed: int, files: Path) -> None:
    rng = random.Random(seed * 100 + worker)
    appended = refused = duplicates = 0
    own = f"grpo-w{worker}"
    with Ledger.open(target, actor=f"worker-{worker}", synchronous="NORMAL") as ledger:
        (files / f"ready-{worker}").touch()
        deadline = time.monotonic() + 120
        while not (files / "go").exists():
            if time.monotonic() > deadline:
                raise SystemExit("no go file within 120 s")
            time.sleep(0.005)
        for step in range(n):
            cid = "shared" if rng.random() < 0.75 else own
            kind = rng.choice(["prompt_queue", "trajectories"])
            state_file = files / f"{worker}-{step}.jsonl"
            state_file.write_text(f"{worker} {step}\n")
            commands = {
                "trusted": lambda: ledger.record_trusted_state(cid, kind, state_file),  # noqa: B023
                "check": lambda: ledger.check(cid),  # noqa: B023
                "fail": lambda: ledger.fail_stage(cid, rng.choice(["sampling", "reward"])),  # noqa: B023
                "recovered": lambda: ledger.complete_recovery(cid),  # noqa: B023
                "handoff": lambda: ledger.hand_off(cid),  # noqa: B023
                # A setting change now and then: it invalidates online candidates in every stream.
                "window": lambda: ledger.advance_window(2 + step // 100),  # noqa: B023
            }
            name = rng.choice(list(commands)[:-1])
            if worker == 0 and step % 50 == 25:
                name = "window"
            try:
                result = commands[name]()
            except (IllegalCommandError, InputError):
                refused += 1
                continue
            if result.duplicate:
                duplicates += 1
            elif result.appended:
                appended += len(result.events)
    print(json.dumps({"appended": appended, "refused": refused, "duplicates": duplicates}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
