"""What every suite shares: result rows, interleaved rounds, clocks, a workspace, peers.

Every figure is a ratio against a baseline doing the same work in the same run. Each
round runs every contender once, in an order that rotates from round to round; the
first round is a warm-up and is thrown away. A row reports the median of the
per-round ratios and their spread [min..max].
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson

from lifecycle_fsm import Ledger, hash_directory

ACTOR = "trainer@gpu-node-07:41237"
KIND = "prompt_queue"
cpu = time.process_time  # this process's CPU (user + system): the host's flush waits are not in it


@dataclass
class Row:
    """One line of the table. `target` is (operator, value) or None for a row given for information."""

    id: str
    what: str
    clock: str
    ratios: list[float] = field(default_factory=list)
    target: tuple[str, float] | None = None
    figures: str = ""
    ok: bool | None = None  # for rows without a ratio (lost events): the check's outcome

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def met(self) -> bool | None:
        if self.ok is not None or self.target is None or self.ratio is None:
            return self.ok
        op, value = self.target
        return self.ratio <= value if op == "<=" else self.ratio >= value

    def cells(self) -> list[str]:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f} [{min(self.ratios):.2f}..{max(self.ratios):.2f}]"
        target = "-" if self.target is None else f"{self.target[0]} {self.target[1]:g}x"
        met = {None: "-", True: "yes", False: "NO"}[self.met]
        return [self.id, self.what, self.clock, ratio, target, met, self.figures]

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "what": self.what,
            "clock": self.clock,
            "ratio": self.ratio,
            "ratios": self.ratios,
            "target": None if self.target is None else f"{self.target[0]} {self.target[1]:g}",
            "met": self.met,
            "figures": self.figures,
        }


@dataclass
class Settings:
    rounds: int
    warmup: int
    scale: float  # 1.0 for a full run; --quick and --smoke shrink every suite's work by it
    workdir: Path
    pg_url: str
    ws: Workspace


def interleaved(contenders: dict[str, Callable[[], float]], settings: Settings) -> dict[str, list[float]]:
    """Each contender once per round, the order rotating; the warm-up rounds' figures are dropped."""
    names = list(contenders)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(settings.warmup + settings.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            value = contenders[name]()
            if r >= settings.warmup:
                out[name].append(value)
    return out


def per_round(num: Sequence[float], den: Sequence[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


def spread(values: Sequence[float], unit: str = "us", scale: float = 1e6) -> str:
    """Absolute figures for a row's last column: median [min..max] unit."""
    scaled = [v * scale for v in values]
    return f"{statistics.median(scaled):,.0f} [{min(scaled):,.0f}..{max(scaled):,.0f}] {unit}"


def sized(n: int, settings: Settings, least: int = 2) -> int:
    return max(least, round(n * settings.scale))


def script(name: str) -> str:
    """A console script installed beside this interpreter (else on PATH)."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed beside {sys.executable} nor on PATH")
    return found


def not_measured(row_id: str, what: str, why: str, target: tuple[str, float] | None = None) -> Row:
    return Row(row_id, what, "-", target=target, figures=f"not measured: {why}")


# --- a workspace: an SFT baseline, candidate manifests, trusted-state files ---------------------


def _adapter(folder: Path, fill: int) -> str:
    """A small LoRA adapter folder as PEFT saves one; returns its digest as `lifecycle hash` gives it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    (folder / "adapter_model.safetensors").write_bytes(bytes([fill % 251]) * 4096)
    return hash_directory(str(folder))


class Workspace:
    """Files the commands read: a baseline, `count` candidate manifests, two trusted states each."""

    def __init__(self, root: Path, count: int) -> None:
        sft = _adapter(root / "sft" / "adapter", 0)
        self.baseline = root / "sft" / "manifest.json"
        baseline = {"semantic_id": "PT-SFT-DELIVERY", "artifacts": {"adapter": {"path": "adapter", "sha256": sft}}}
        self.baseline.write_text(json.dumps(baseline))
        self.manifests: list[Path] = []
        self.trusted: list[dict[str, str]] = []
        for i in range(count):
            home = root / f"c{i:05d}"
            manifest = {
                "semantic_id": "PT-GRPO-GROUPWISE",
                "source_policy_version": sft,
                "policy_version": f"grpo-v7-c{i:05d}",
                "evaluation_version": "eval-v1",
                "trajectory_identity": {"verifier_version": "math-v1"},
                "evidence_window_index": 1,
                "decision": "accept",
                "artifacts": {"adapter": {"path": "adapter", "sha256": _adapter(home / "adapter", i + 1)}},
            }
            (home / "manifest.json").write_text(json.dumps(manifest, indent=2))
            self.manifests.append(home / "manifest.json")
            files = {kind: home / f"{kind}-step-000120.jsonl" for kind in ("prompt_queue", "trajectories")}
            for f in files.values():
                f.write_text('{"prompt_id": "p-0001", "seed": 7}\n')
            self.trusted.append({kind: str(f) for kind, f in files.items()})


def new_ledger(target: str | Path, ws: Workspace, sync: str, candidates: int = 0, prefix: str = "c") -> Ledger:
    """A ledger with its settings and baseline, and `candidates` received (`{prefix}00000`, ...)."""
    ledger = Ledger.open(target, synchronous=sync, actor=ACTOR)
    ledger.init()
    ledger.activate_baseline(ws.baseline)
    for i in range(candidates):
        ledger.receive(ws.manifests[i], candidate_id=f"{prefix}{i:05d}")
    return ledger


def mix_commands(ledger: Ledger, ws: Workspace, i: int, cid: str) -> list[Callable[[], Any]]:
    """A candidate's commands as a training run drives them: receive, two trusted states,
    check, a failed reward stage (recovery planned), recovered, check again."""
    files = ws.trusted[i]
    return [
        lambda: ledger.receive(ws.manifests[i], candidate_id=cid),
        lambda: ledger.record_trusted_state(cid, "prompt_queue", files["prompt_queue"]),
        lambda: ledger.record_trusted_state(cid, "trajectories", files["trajectories"]),
        lambda: ledger.check(cid),
        lambda: ledger.fail_stage(cid, "reward"),
        lambda: ledger.complete_recovery(cid),
        lambda: ledger.check(cid),
    ]


# --- the store's rows, read back: the one place a suite reads the events table itself ------------


def sqlite_rows(path: Path, after: int) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
    """The columns (name, declared type) of the ledger's `events` table and its rows after `after`.

    The baselines insert copies of exactly what our store wrote; the table's name and its
    `seq`, `stream_id`, `version` and `event_id` columns are the documented log format.
    """
    conn = sqlite3.connect(path)
    try:
        columns = [(r[1], r[2]) for r in conn.execute("PRAGMA table_info(events)")]
        rows = conn.execute("SELECT * FROM events WHERE seq > ? ORDER BY seq", (after,)).fetchall()
    finally:
        conn.close()
    return columns, rows


class Copies:
    """Copies of stored rows for a baseline table: new seq, a later version, a fresh event id.

    Every copy keeps the original's sizes, so a baseline writes the same bytes our store did.
    """

    def __init__(self, columns: Sequence[str], start_seq: int) -> None:
        self.seq_at, self.version_at, self.id_at = (list(columns).index(c) for c in ("seq", "version", "event_id"))
        self.seq = start_seq
        self.shift = 0

    def next_batch(self, groups: Sequence[Sequence[tuple[Any, ...]]]) -> list[list[tuple[Any, ...]]]:
        self.shift += 1_000_000
        return [[self._copy(row) for row in group] for group in groups]

    def _copy(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        self.seq += 1
        out = list(row)
        out[self.seq_at] = self.seq
        out[self.version_at] = row[self.version_at] + self.shift
        old = row[self.id_at]
        out[self.id_at] = os.urandom(len(old)) if isinstance(old, bytes) else (uuid.uuid4().hex * 4)[: len(old)]
        return tuple(out)


# --- PostgreSQL: a fresh schema per contender --------------------------------------------------

_SCHEMAS: list[tuple[str, str]] = []


def postgres_problem(url: str) -> str | None:
    """Why PostgreSQL cannot be measured at `url`, or None when it can."""
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=5).close()
    except Exception as e:  # any reason at all: said in one line
        return f"PostgreSQL at {url} cannot be used: {type(e).__name__}: {' '.join(str(e).split())}"
    return None


def pg_schema(base: str, tag: str) -> tuple[str, str]:
    """A new empty schema and a URL whose search_path is it."""
    import psycopg

    schema = f"bench_{tag}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    _SCHEMAS.append((base, schema))
    return schema, f"{base}{'&' if '?' in base else '?'}options={quote(f'-csearch_path={schema}', safe='')}"


def drop_schemas() -> None:
    """Drop the schemas this run made (never another's: the server may be shared)."""
    import psycopg

    for base in {base for base, _ in _SCHEMAS}:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {', '.join(s for b, s in _SCHEMAS if b == base)} CASCADE")
    _SCHEMAS.clear()


# --- eventsourcing, the peer ---------------------------------------------------------------------


def eventsourcing_missing() -> str | None:
    """Why the eventsourcing rows cannot be measured here, or None when they can."""
    try:
        import eventsourcing  # noqa: F401
    except ImportError:
        return "eventsourcing is not installed (pip install -e '.[bench]')"
    return None


_APP: type | None = None


def es_app(env: dict[str, str]) -> Any:
    """An eventsourcing Application whose aggregate records what our commands record.

    Its command is the library's documented pattern: `repository.get` (aggregate cache on),
    a command method that triggers one event, `save`.
    """
    global _APP  # noqa: PLW0603 - one set of classes per process: eventsourcing registers their topics
    if _APP is None:
        from eventsourcing.application import Application
        from eventsourcing.domain import Aggregate, event

        class Candidate(Aggregate):  # type: ignore[misc]
            @event("Received")  # type: ignore[misc]
            def __init__(self, name: str, payload: dict[str, Any] | None) -> None:
                self.name = name

            @event("Recorded")  # type: ignore[misc]
            def record(self, type_name: str, payload: dict[str, Any]) -> None:
                self.last = type_name

        class CandidateApp(Application):  # type: ignore[misc]
            def receive(self, name: str, events: Sequence[tuple[str, dict[str, Any]]] = ()) -> Any:
                candidate = Candidate(name, events[0][1] if events else None)
                for type_name, payload in events[1:]:
                    candidate.record(type_name, payload)
                self.save(candidate)
                return candidate.id

            def record(self, cid: Any, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
                candidate = self.repository.get(cid)
                for type_name, payload in events:
                    candidate.record(type_name, payload)
                self.save(candidate)

        _APP = CandidateApp
    return _APP(env={"AGGREGATE_CACHE_MAXSIZE": "10000", **env})


def es_sqlite(path: Path, sync: str) -> Any:
    """eventsourcing on SQLite, WAL (its default), every connection at `synchronous=sync`
    (it leaves SQLite's default, FULL: the connection factory is wrapped to set it)."""
    app = es_app({"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)})
    pool = app.recorder.datastore.pool
    make = pool._create_connection

    def create() -> Any:
        conn = make()
        conn._sqlite_conn.execute(f"PRAGMA synchronous={sync}")
        return conn

    pool._create_connection = create
    for conn in list(pool._pool):
        conn._sqlite_conn.execute(f"PRAGMA synchronous={sync}")
    return app


def es_contender(app: Any, columns: Sequence[str], groups: Sequence[Sequence[tuple[Any, ...]]]) -> Callable[[], float]:
    """eventsourcing recording what each of our commands recorded (the event content given, not
    computed): a stream our round created is a new aggregate, one that existed is got and saved."""
    stream, version, kind, payload = (list(columns).index(c) for c in ("stream_id", "version", "type", "payload"))
    recorded = [(rows[0][stream], [(r[kind], orjson.loads(r[payload])) for r in rows]) for rows in groups if rows]
    existing = {rows[0][stream]: app.receive(rows[0][stream]) for rows in groups if rows and rows[0][version] > 1}

    def es() -> float:
        ids = dict(existing)
        t0 = cpu()
        for name, events in recorded:
            if name in ids:
                app.record(ids[name], events)
            else:
                ids[name] = app.receive(name, events)
        return (cpu() - t0) / len(groups)

    return es


def es_row(row_id: str, what: str, clock: str, t: dict[str, list[float]], missing: str | None) -> Row:
    if missing is not None:
        return not_measured(row_id, what, missing, (">=", 3.0))
    return Row(row_id, what, clock, per_round(t["es"], t["ours"]), (">=", 3.0), f"es {spread(t['es'])}")
