"""Shared pieces of the benchmarks: timing rounds, result rows, realistic events, ledger building.

Figures are ratios measured in the same run: every contender runs once per round, the
order rotates between rounds, and we report the median of the per-round figures and
their spread (min..max). Nothing here is a timed assertion.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import os
import platform
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lifecycle_fsm.events import (
    LEDGER_STREAM,
    BaselineActivated,
    CandidateReceived,
    ChecksRecorded,
    Event,
    EvidenceInvalidated,
    HandoffDecided,
    LedgerInitialized,
    RecoveryCompleted,
    RecoveryPlanned,
    StageFailed,
    TrustedStateInvalidated,
    TrustedStateRecorded,
    WindowAdvanced,
    stream_of,
)
from lifecycle_fsm.store.records import NewEvent
from lifecycle_fsm.store.sqlite import SQLiteEventStore

clock = time.perf_counter
ACTOR = "trainer@gpu-node-07:41237"


# --- results ---------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table; `met` is None for figures without a target."""

    section: str
    name: str
    target: str
    measured: str
    ratio: float | None = None
    met: bool | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def spread(values: Iterable[float]) -> tuple[float, float]:
    vals = list(values)
    return (min(vals), max(vals))


def summary(values: list[float], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    """Median, min, max and every round's value (scaled), for the JSON report."""
    scaled = [v * scale for v in values]
    return {
        "median": round(median(scaled), digits),
        "min": round(min(scaled), digits),
        "max": round(max(scaled), digits),
        "rounds": [round(v, digits) for v in scaled],
    }


def fmt_spread(values: list[float], digits: int = 2) -> str:
    lo, hi = spread(values)
    return f"{median(values):.{digits}f} [{lo:.{digits}f}..{hi:.{digits}f}]"


def interleaved(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run every contender once per round, rotating the order; each returns its own figure."""
    names = list(contenders)
    results: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            results[name].append(contenders[name]())
    return results


def per_round_ratio(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


def machine_line(workdir: Path) -> dict[str, Any]:
    """Where the figures come from: platform, Python, SQLite, cores, file system."""
    try:
        es_version: str | None = importlib.metadata.version("eventsourcing")
    except importlib.metadata.PackageNotFoundError:
        es_version = None
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "cpu_count": os.cpu_count(),
        "filesystem": _filesystem(workdir),
        "eventsourcing": es_version,
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _filesystem(path: Path) -> str | None:
    """The mount (device, type) holding `path`, from /proc/mounts when there is one."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    best: tuple[str, str, str] | None = None
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        inside = len(parts) >= 3 and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/"))
        if inside and (best is None or len(parts[1]) > len(best[1])):
            best = (parts[0], parts[1], parts[2])
    return None if best is None else f"{best[2]} on {best[1]} ({best[0]})"


def remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


# --- realistic events ----------------------------------------------------------------------


def sha_of(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


class Clock:
    """Deterministic event timestamps, 1 ms apart (the store never reads them)."""

    def __init__(self) -> None:
        self._t = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
        self._step = dt.timedelta(milliseconds=1)

    def __call__(self) -> str:
        self._t += self._step
        return self._t.isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class _Candidate:
    cid: str
    version: int = 0
    step: int = -1  # -1: not yet received
    revision: int = 0


# Each candidate cycles through these legal moves after its CandidateReceived (rev 0):
# trusted states recorded, a failed reward stage and its recovery, a passing check, a
# `tune` hand-off and revision, another check, `ready`, then a window change invalidates
# the evidence and the cycle starts again. (state after each step)
CYCLE = (
    ("trusted:prompt_queue", "received"),
    ("trusted:trajectories", "received"),
    ("stage_failed", "received"),
    ("recovery_planned", "recovering"),
    ("recovery_completed", "received"),
    ("trusted:pre_update_checkpoint", "received"),
    ("checks", "verified"),
    ("handoff:tune", "tune"),
    ("revise", "received"),
    ("untrust:trajectories", "received"),
    ("checks", "verified"),
    ("handoff:ready_for_evaluation", "ready"),
    ("invalidated", "received"),
)


class Streams:
    """Realistic candidate streams built from the real event classes' `to_payload()`."""

    def __init__(self, root: str = "/data/lifecycle", sft: str | None = None) -> None:
        self.root = root
        self.sft = sft or sha_of("sft-adapter")
        self.window = 1
        self.ledger_version = 0
        self.candidates: dict[str, _Candidate] = {}
        self.clock = Clock()

    def _new(self, stream_id: str, event: Event) -> NewEvent:
        return NewEvent(
            stream_id, event.TYPE, event.SCHEMA_VERSION, event.to_payload(), uuid.uuid4().hex, self.clock(), ACTOR
        )

    def ledger_events(self) -> tuple[int, list[NewEvent]]:
        """Events for the ledger stream: init + baseline first, then one window advance per call."""
        expected = self.ledger_version
        if expected == 0:
            events: list[Event] = [
                LedgerInitialized(2, 1),
                BaselineActivated(
                    policy_version=self.sft, previous_policy_version=None,
                    manifest_path=f"{self.root}/sft/manifest.json", manifest_sha256=sha_of("sft-manifest"),
                    adapter_path=f"{self.root}/sft/adapter", adapter_sha256=self.sft, adapter_actual_sha256=self.sft,
                    adapter_error=None,
                ),
            ]  # fmt: skip
        else:
            events = [WindowAdvanced(self.window + 1, self.window)]
            self.window += 1
        self.ledger_version += len(events)
        return expected, [self._new(LEDGER_STREAM, e) for e in events]

    def candidate_fields(self, cid: str, revision: int) -> dict[str, Any]:
        base = f"{self.root}/candidates/{cid}/r{revision}"
        return {
            "candidate_kind": "grpo", "semantic_id": "PT-GRPO-GROUPWISE", "source_policy_version": self.sft,
            "policy_version": f"{cid}-r{revision}", "evaluation_version": "eval-v1",
            "preference_evidence_version": None, "verifier_version": "math-v1", "evidence_window_index": self.window,
            "decision": "accept", "adapter_path": "adapter", "adapter_resolved_path": f"{base}/adapter",
            "adapter_sha256": sha_of(cid, revision, "adapter"),
        }  # fmt: skip

    def _artifact(self, cid: str, revision: int) -> dict[str, Any]:
        sha = sha_of(cid, revision, "adapter")
        path = f"{self.root}/candidates/{cid}/r{revision}/adapter"
        return {"path": path, "expected": sha, "actual": sha, "verified": True, "error": None}

    def _evidence(self, cid: str, revision: int) -> dict[str, Any]:
        return {
            "freshness": {"fresh": True, "failed_checks": []},
            "artifact": self._artifact(cid, revision),
            "rollback": {"path": f"{self.root}/sft/adapter", "expected": self.sft, "actual": self.sft,
                         "verified": True, "error": None},
            "settings": {"active_policy_version": self.sft, "active_window": self.window, "max_window_age": 2,
                         "evaluation_version": None, "window_age": 0, "ledger_version": self.ledger_version},
        }  # fmt: skip

    def trusted_path(self, cid: str, kind: str, revision: int) -> str:
        return f"{self.root}/runs/{cid}/r{revision}/{kind}"

    def _event(self, c: _Candidate, move: str) -> Event:
        cid, rev = c.cid, c.revision
        name, _, arg = move.partition(":")
        if name == "trusted":
            return TrustedStateRecorded(arg, self.trusted_path(cid, arg, rev), sha_of(cid, rev, arg))
        if name == "untrust":
            return TrustedStateInvalidated(arg, "superseded by a newer trusted state")
        if name == "stage_failed":
            return StageFailed("reward")
        if name == "recovery_planned":
            path = self.trusted_path(cid, "trajectories", rev)
            sha = sha_of(cid, rev, "trajectories")
            states = {"trajectories": {"available": True, "source": "recorded", "path": path, "expected": sha,
                                       "actual": sha, "error": None}}  # fmt: skip
            action = "resume_reward_from_saved_trajectories"
            return RecoveryPlanned("reward", "trajectories", True, action, False, states)
        if name == "recovery_completed":
            return RecoveryCompleted("reward", "resume_reward_from_saved_trajectories")
        if name == "checks":
            return ChecksRecorded(passed=True, reason_codes=[], **self._evidence(cid, rev))
        if name == "handoff":
            return HandoffDecided(
                handoff_status=arg, upstream_decision="accept", hard_failures=[], reason_codes=[],
                **self._evidence(cid, rev),
            )  # fmt: skip
        if name == "revise":
            c.revision += 1
            return self._received(cid, c.revision)
        if name == "invalidated":
            return EvidenceInvalidated("window", self.window - 1, self.window)
        raise AssertionError(move)

    def _received(self, cid: str, revision: int) -> CandidateReceived:
        manifest = f"{self.root}/candidates/{cid}/r{revision}/manifest.json"
        return CandidateReceived(cid, revision, manifest, sha_of(cid, revision, "manifest"),
                                 self.candidate_fields(cid, revision))  # fmt: skip

    def take(self, cid: str, k: int) -> tuple[int, list[NewEvent], str]:
        """The next `k` legal events of one candidate: (expected version, events, state after)."""
        c = self.candidates.get(cid)
        if c is None:
            c = self.candidates[cid] = _Candidate(cid)
        expected = c.version
        stream = stream_of(cid)
        events: list[NewEvent] = []
        state = "received"
        for _ in range(k):
            if c.step < 0:
                event: Event = self._received(cid, 0)
                c.step = 0
            else:
                move, state = CYCLE[c.step]
                event = self._event(c, move)
                c.step = (c.step + 1) % len(CYCLE)
            events.append(self._new(stream, event))
        c.version += k
        return expected, events, state


def extend_ledger(
    store: SQLiteEventStore,
    streams: Streams,
    candidate_ids: list[str],
    add: int,
    *,
    per_append: int = 5,
    per_tx: int = 5000,
    start: int = 0,
) -> int:
    """Append `add` events: round-robin over candidates, `per_append` events per stream and
    about `per_tx` per transaction, with one ledger-stream event per transaction.
    Returns the next round-robin position."""
    done = 0
    i = start
    while done < add:
        with store.transaction() as tx:
            in_tx = 0
            if streams.ledger_version == 0 or add - done > per_tx:
                expected, events = streams.ledger_events()
                tx.append(LEDGER_STREAM, expected, events)
                in_tx += len(events)
            while in_tx < per_tx and done + in_tx < add:
                cid = candidate_ids[i % len(candidate_ids)]
                i += 1
                k = min(per_append, add - done - in_tx)
                expected, events, state = streams.take(cid, k)
                tx.append(stream_of(cid), expected, events, status=state, category="grpo")
                in_tx += k
        done += in_tx
    return i


def payload_bytes(db: Path, limit: int = 20000) -> float:
    """Mean stored payload length over the first `limit` events of a ledger file."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT avg(length(payload)) FROM (SELECT payload FROM events ORDER BY seq LIMIT ?)", (limit,)
        ).fetchone()
    finally:
        conn.close()
    return float(row[0] or 0.0)
