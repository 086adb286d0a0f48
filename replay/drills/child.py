"""A writer process for drills: `python -m replay.drills.child DB PLAN_JSON`.

`crash` runs one command here with `LIFECYCLE_FAULT` set, so the store SIGKILLs this
process at the planned commit point; `concurrently` starts several of these at once.
The plan is `{"actor", "calls": [[method, args, kwargs], …], "go": path or null}` (the
simulator adds `clock`, a fixed time, and `id_prefix`, so its ledger head is reproducible): the
child opens its own `Ledger`, says `ready`, waits for the `go` file (so writers start
together), then runs each call, printing one line per call:
`done I SEQ…`, or `refused I CLASS MESSAGE` for a `LifecycleError`.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.ledger import Ledger


def main(argv: list[str]) -> int:
    db, plan_json = argv
    plan = orjson.loads(plan_json)
    fixed: dict[str, Any] = {}
    if "clock" in plan:
        ids = itertools.count(1)
        fixed = {"clock": lambda: plan["clock"], "new_id": lambda: f"{plan['id_prefix']}-{next(ids)}"}
    ledger = Ledger.open(db, synchronous="NORMAL", actor=plan["actor"], **fixed)
    print("ready", flush=True)
    if plan.get("go"):
        go = Path(plan["go"])
        while not go.exists():
            time.sleep(0.001)
    for i, (method, args, kwargs) in enumerate(plan["calls"], start=1):
        print("begin", i, flush=True)
        try:
            result = getattr(ledger, method)(*args, **kwargs)
        except LifecycleError as e:
            print("refused", i, type(e).__name__, orjson.dumps(str(e)).decode(), flush=True)
            continue
        seqs = [] if result.duplicate else [e.seq for e in result.events]
        print("done", i, *seqs, flush=True)
    ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
