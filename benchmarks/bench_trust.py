"""What trust costs (SPEC §8): `verify --pubkey` vs plain verify, and re-hashing the rows a read decodes.

Run from `bench_replay` on its largest ledger, after its own measures:
- one seal per 10,000 events is appended (an audit sealed every so often), then
  `verify` with the seals' signatures checked (`--pubkey`) and without, interleaved:
  the ratio, and the events/s of the signed one (target >= 100k ev/s);
- `status ID`, `explain ID` and `status` with each row's own hash recomputed (what the
  CLI does) and with that check switched off (the code before it), interleaved: the
  ratio checked / unchecked (target: not measurably slower, <= 1.10x).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import Row, clock, fmt_spread, interleaved, median, summary
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lifecycle_fsm import upcasting
from lifecycle_fsm.cli.render import candidate_json
from lifecycle_fsm.keys import PublicKeys
from lifecycle_fsm.ledger import Ledger, utc_now
from lifecycle_fsm.seals import add_trust_findings, seal
from replay import explain, load_state
from replay import verify as verify_ledger
from store.sqlite import SQLiteEventStore

__all__ = ["run"]


def _open(path: Path) -> SQLiteEventStore:
    return SQLiteEventStore(path, synchronous="NORMAL")


def _unchecked(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` with the per-row hash check switched off (the read path before issue #9)."""

    def run() -> Any:
        saved = upcasting.check_row
        upcasting.check_row = lambda event: None
        try:
            return fn()
        finally:
            upcasting.check_row = saved

    return run


def run(path: Path, long_id: str, rounds: int) -> tuple[list[Row], dict[str, Any]]:
    key = Ed25519PrivateKey.generate()
    keys = PublicKeys([key.public_key()])
    store = _open(path)
    seals = max(1, store.count_events() // 10_000)
    for _ in range(seals):
        seal(store, key, actor="bench", clock=utc_now)
    events = store.count_events()
    store.close()

    def verify(with_keys: bool) -> float:
        s = _open(path)
        try:
            t0 = clock()
            report = add_trust_findings(s, verify_ledger(s), (), keys if with_keys else PublicKeys())
            elapsed = clock() - t0
        finally:
            s.close()
        assert report["ok"], report
        assert report["seals"]["count"] == seals, report
        return elapsed

    verify_rounds = max(3, rounds - 2)
    vt = interleaved({"pubkey": lambda: verify(True), "plain": lambda: verify(False)}, verify_rounds)
    ratio = [p / q for p, q in zip(vt["pubkey"], vt["plain"], strict=True)]
    rate = [events / t / 1e3 for t in vt["pubkey"]]

    def timed(fn: Callable[[SQLiteEventStore], Any]) -> Callable[[], float]:
        def once() -> float:
            s = _open(path)
            try:
                t0 = clock()
                fn(s)
                return clock() - t0
            finally:
                s.close()

        return once

    reads: dict[str, Callable[[SQLiteEventStore], Any]] = {
        "status_id": lambda s: candidate_json(Ledger(s).candidate(long_id)),
        "explain": lambda s: explain(s, long_id),
        "status_all": lambda s: load_state(s, checked=True).state,
    }
    contenders: dict[str, Callable[[], float]] = {}
    for name, fn in reads.items():
        contenders[f"{name}_checked"] = timed(fn)
        if name == "status_all":
            contenders[f"{name}_unchecked"] = timed(lambda s: load_state(s).state)
        else:
            contenders[f"{name}_unchecked"] = _unchecked(timed(fn))
    times = interleaved(contenders, rounds)
    rows = [
        Row("trust", f"verify --pubkey / verify, {events:,} events, {seals} seals", "-",
            f"{fmt_spread(ratio, 3)}x", median(ratio), None, {"ratio": summary(ratio)}),
        Row("trust", f"verify --pubkey rate, {events:,} events", ">= 100k ev/s", f"{fmt_spread(rate, 0)}k ev/s",
            median(rate) / 100, median(rate) >= 100, {"kevents_per_s": summary(rate, 1, 1)}),
    ]  # fmt: skip
    for name in reads:
        r = [c / u for c, u in zip(times[f"{name}_checked"], times[f"{name}_unchecked"], strict=True)]
        rows.append(Row("trust", f"{name}: rows re-hashed / not, {events:,} events", "<= 1.10x",
                        f"{fmt_spread(r, 3)}x", median(r), median(r) <= 1.10, {"ratio": summary(r)}))  # fmt: skip
    detail = {"events": events, "seals": seals, "verify_s": {k: summary(v) for k, v in vt.items()}}
    detail |= {k: summary(v, 1e3, 2) for k, v in times.items()}
    return rows, detail
