"""Shared fixtures: real SQLite files, real adapter directories, real manifests.

`ws` is a workspace in `tmp_path` that writes an SFT baseline and DPO / GRPO / RLVR
candidates in the seed's manifest shapes (built by `lifecycle_fsm.replay.drills.workspace`, the
factory the drills and examples use too), with adapter folders whose bytes are
hashed by `hash_directory` exactly as `lifecycle hash` would.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from backends import backend, pg_store, pg_url  # noqa: F401 - fixtures: a fresh PostgreSQL schema, every backend in turn
from click.testing import CliRunner, Result

from lifecycle_fsm import logs
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.cli import main
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import write_manifest
from lifecycle_fsm.replay.drills.workspace import baseline_manifest, candidate_manifest, write_adapter

REPO = Path(__file__).resolve().parent.parent


class Workspace:
    """A folder holding adapters, manifests and one ledger file."""

    def __init__(self, root: Path, *, paths_from_root: bool = False) -> None:
        """`paths_from_root`: manifests write adapter paths relative to `root` (a project root,
        read with it as the artifact root), not to their own folder."""
        self.root = root
        self.db = root / "ledger.db"
        self.sft_sha: str | None = None
        self.paths_from_root = paths_from_root

    def _adapter_path(self, name: str) -> dict[str, str]:
        return {"adapter_path": f"{name}/adapter"} if self.paths_from_root else {}

    def adapter(self, name: str, *, size: int = 64 * 1024, seed: int = 0) -> Path:
        """An adapter folder: adapter_config.json and a weights file of `size` random bytes."""
        return write_adapter(self.root / name / "adapter", name, random.Random(f"{name}:{seed}").randbytes(size))

    def write_manifest(self, name: str, manifest: dict[str, Any]) -> Path:
        return write_manifest(self.root / name / "manifest.json", manifest)

    def baseline(self, name: str = "sft", **overrides: Any) -> Path:
        """An SFT manifest whose adapter sha256 becomes the active policy version."""
        sha = hash_directory(self.adapter(name))
        self.sft_sha = self.sft_sha or sha
        return self.write_manifest(name, baseline_manifest(sha, **(self._adapter_path(name) | overrides)))

    def _candidate(self, kind: str, name: str, overrides: dict[str, Any]) -> Path:
        sha = hash_directory(self.adapter(name))
        fields = {"source_policy_version": self.sft_sha, "policy_version": name} | self._adapter_path(name) | overrides
        manifest = candidate_manifest(kind, adapter_sha256=sha, **fields)
        for key in [k for k, v in overrides.items() if v is _DROP]:
            del manifest[key]
        return self.write_manifest(name, manifest)

    def dpo(self, name: str = "dpo-v5", **overrides: Any) -> Path:
        """A DPO candidate manifest (seed 84's shape)."""
        return self._candidate("dpo", name, overrides)

    def grpo(self, name: str = "grpo-v7", **overrides: Any) -> Path:
        """A GRPO candidate manifest (seed 85's shape), evidence from window 1."""
        return self._candidate("grpo", name, overrides)

    def rlvr(self, name: str = "rlvr-v1", **overrides: Any) -> Path:
        """An RLVR candidate manifest: GRPO's shape with `candidate_kind: rlvr`."""
        return self._candidate("rlvr", name, overrides)

    def ledger(self, **kwargs: Any) -> Ledger:
        if self.paths_from_root:
            kwargs.setdefault("artifact_root", self.root)
        return Ledger.open(self.db, synchronous="NORMAL", **kwargs)


# The long campaign (`LIFECYCLE_RELIABILITY=long`, as for tests/reliability): generated-input tests at full size.
LONG_CAMPAIGN = os.environ.get("LIFECYCLE_RELIABILITY") == "long"


def examples(bounded: int, long: int) -> int:
    """How many examples a hypothesis test generates: `bounded` by default (CI), `long` in the long campaign."""
    return long if LONG_CAMPAIGN else bounded


DROP = _DROP = object()  # pass as an override value to remove a manifest field


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


@pytest.fixture
def ledger(ws: Workspace) -> Iterator[Ledger]:
    with ws.ledger() as led:
        yield led


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """The CLI configures structlog globally; keep tests independent of each other."""
    yield
    structlog.reset_defaults()
    logs._pending.clear()  # a command line's setting that no event has applied yet


def invoke(db: Path, *args: str) -> Result:
    """Run the CLI in-process (click's runner) against one ledger file."""
    return CliRunner().invoke(main, ["--db", str(db), *args], catch_exceptions=False)


def hand_off_dpo(ws: Workspace) -> Path:
    """The workspace's ledger with the DPO candidate received, checked and handed off (ready), through the CLI."""
    for args in (
        ("init",),
        ("baseline", "activate", str(ws.baseline())),
        ("receive", str(ws.dpo())),
        ("check", "dpo-v5"),
        ("handoff", "dpo-v5"),
    ):
        assert invoke(ws.db, *args).exit_code == 0, args
    return ws.db


def cli(
    db: Path | str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`run_cli` in this process (click's runner): the same exit code, stdout and stderr, without the
    cost of a new interpreter, for the tests that check what a command decides rather than how a
    process behaves (signals, closed streams, environment faults)."""
    with contextlib.chdir(cwd or os.getcwd()):
        result = CliRunner().invoke(main, ["--db", str(db), *args], env=env, catch_exceptions=False)
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def run_cli(
    db: Path | str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a real subprocess, as a user would (`db` a file or a PostgreSQL URL)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "--db", str(db), *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        check=False,
        timeout=120,
    )


def count_events(db: Path) -> int:
    """Events in a ledger file, read with plain sqlite3 (0 when the file does not exist)."""
    import sqlite3

    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """An empty folder this process cannot write: a read-only bind mount as root (root ignores
    permission bits), a 0555 folder otherwise; skipped only where root may not mount."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(
            ["mount", "--bind", str(locked), str(locked)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            pytest.skip(f"cannot make a read-only folder as root here (mount --bind: {done.stderr.strip()})")
        mounted = True
        subprocess.run(["mount", "-o", "remount,ro,bind", str(locked)], capture_output=True, check=True)
    try:
        assert not os.access(locked, os.W_OK)
        yield locked
    finally:
        if mounted:
            subprocess.run(["umount", str(locked)], check=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    """`--reliability-long`: the full reliability campaign (tests/reliability), not CI's bounded one."""
    parser.addoption(
        "--reliability-long",
        action="store_true",
        help="Run the long reliability campaign (also: LIFECYCLE_RELIABILITY=long).",
    )


def restore_triggers(conn: Any) -> None:
    """What a careful file writer does after editing: put the append-only triggers back, so
    `verify` does not report them missing (the pins and seals must catch the edit instead)."""
    from lifecycle_fsm.store.sqlite_schema import SCHEMA

    for statement in SCHEMA:  # CREATE … IF NOT EXISTS: the table is there, the triggers come back
        conn.execute(statement)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """A fresh Ed25519 key pair (`key new`): `keys / "lifecycle-signing.key"` and `.pub`."""
    assert invoke(tmp_path / "unused.db", "key", "new", "--out", str(tmp_path / "keys")).exit_code == 0
    return tmp_path / "keys"
