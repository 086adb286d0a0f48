"""One of two supervisor processes that take turns on one candidate (tests/test_cached_commands.py).

Usage: python tests/alternate_worker.py TARGET NAME
Reads one JSON command per stdin line, runs it on its long-lived Ledger (whose stream
cache the other process keeps making stale), answers one JSON line: the version and
state it left, the events it appended, and how many of its attempts were re-decided
because the cache was stale: after the append refused (`command_retried` with `cached`)
or after the cache said no (`command_reread`).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import structlog

from lifecycle_fsm import Ledger


def run(ledger: Ledger, cmd: dict[str, Any]) -> Any:
    cid = cmd["candidate"]
    match cmd["command"]:
        case "receive":
            return ledger.receive(cmd["manifest"])
        case "trusted":
            return ledger.record_trusted_state(cid, cmd["kind"], cmd["path"])
        case "check":
            return ledger.check(cid)
        case "fail":
            return ledger.fail_stage(cid, cmd["stage"])
        case "recovered":
            return ledger.complete_recovery(cid)
        case "window":
            return ledger.advance_window(cmd["window"])
    raise ValueError(cmd)


def main(target: str, name: str) -> None:
    with Ledger.open(target, actor=name, synchronous="NORMAL") as ledger:
        for line in sys.stdin:
            cmd = json.loads(line)
            with structlog.testing.capture_logs() as logs:
                result = run(ledger, cmd)
            candidate = getattr(result, "candidate", None)
            print(
                json.dumps(
                    {
                        "version": None if candidate is None else candidate.version,
                        "state": None if candidate is None else str(candidate.state),
                        "appended": [[e.stream_id, e.version] for e in result.events],
                        "stale": sum(
                            1 for entry in logs if entry["event"] == "command_retried" and entry.get("cached")
                        ),
                        "reread": sum(1 for entry in logs if entry["event"] == "command_reread"),
                        "retried": sum(1 for entry in logs if entry["event"] == "command_retried"),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
