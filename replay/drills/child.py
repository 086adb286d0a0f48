"""A drill's writer process: `python -m lifecycle_fsm.replay.drills.child DB PLAN_JSON`. The plan is `{"actor",
"calls": [[method, args, kwargs], …], "go"}` (plus the simulator's `clock` and `id_prefix`); the child says `ready`,
waits for the `go` file, then prints `begin I` before each call and `Outcome.line()` after it."""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import orjson

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay.drills.writers import call


def main(argv: list[str]) -> int:
    db, plan_json = argv
    plan = orjson.loads(plan_json)
    fixed: JSON = {}
    if "clock" in plan:
        ids = itertools.count(1)
        fixed = {"clock": lambda: plan["clock"], "new_id": lambda: f"{plan['id_prefix']}-{next(ids)}"}
    with Ledger.open(db, synchronous="NORMAL", actor=plan["actor"], **fixed) as ledger:
        print("ready", flush=True)
        while plan.get("go") and not Path(plan["go"]).exists():
            time.sleep(0.001)
        for i, (method, args, kwargs) in enumerate(plan["calls"], start=1):
            print("begin", i, flush=True)
            print(call(ledger, (method, args, kwargs)).line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
