"""Hostile paths for keys, pinned heads and attestations: a FIFO, a device, a folder, a sparse file.

`verify --pubkey /dev/zero` read the device until memory ran out (6 GB in 8 s) and a
FIFO blocked `open()` forever, as did `--signing-key`, `--expect-head` and
`attest verify`. Each is now read like a manifest (`limits.read_regular_file`):
regular files only, bounded, so each ends in exit 3, one `Error:` line and nothing
appended. Every case runs as a real subprocess with a timeout and an address-space
cap, so a regression fails the test (timeout or MemoryError) instead of the machine.
"""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import Workspace, count_events
from test_trust_reads import _ready_ledger

from lifecycle_fsm.limits import MAX_ATTESTATION_BYTES, MAX_KEY_BYTES, MAX_SIGNED_HEAD_BYTES

TIMEOUT = 30  # seconds: each refusal takes well under one
MEMORY_CAP = 1 << 30  # bytes of address space: /dev/zero read whole would blow it at once


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, **(env or {})},
        preexec_fn=_capped,
        check=False,
    )


def _cli(db: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "lifecycle_fsm", "--db", str(db), *args], env)


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def _checkpoints(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])


@pytest.fixture
def handed_off(ws: Workspace) -> Path:
    return _ready_ledger(ws)


# What each kind of hostile path is, and what the one Error line says about it.
KINDS = {
    "fifo": "not a regular file",
    "device": "not a regular file",
    "folder": "is a directory",
    "sparse": "-byte limit",
}


def _hostile(kind: str, root: Path) -> Path:
    if kind == "device":
        return Path("/dev/zero")
    path = root / f"hostile-{kind}"
    if kind == "fifo":
        os.mkfifo(path)  # nobody ever writes to it: a blocking open() would wait forever
    elif kind == "folder":
        path.mkdir()
    else:
        with path.open("wb") as fh:
            fh.truncate(10 * 1024**3)  # 10 GB, sparse: no disk used, far over every cap
    return path


# Each command that takes a key, a pinned head or an attestation path; `{p}` is the hostile path.
COMMANDS = {
    "verify --pubkey": ["verify", "--pubkey", "{p}"],
    "verify --expect-head": ["verify", "--expect-head", "{p}"],
    "--signing-key seal": ["--signing-key", "{p}", "seal"],
    "--signing-key checkpoint": ["--signing-key", "{p}", "checkpoint"],
    "--signing-key attest": ["--signing-key", "{p}", "attest", "dpo-v5", "--out", "{out}"],
    "attest verify FILE": ["attest", "verify", "{p}", "--pubkey", "{pub}"],
    "attest verify --pubkey": ["attest", "verify", "{any}", "--pubkey", "{p}"],
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_hostile_trust_path_is_refused_fast_with_nothing_appended(
    ws: Workspace, handed_off: Path, keys: Path, command: str, kind: str
) -> None:
    hostile = _hostile(kind, ws.root)
    out = ws.root / "dpo-v5.intoto.json"
    any_file = ws.root / "some.json"
    any_file.write_text("{}")
    fill = {"p": str(hostile), "out": str(out), "pub": str(keys / "lifecycle-signing.pub"), "any": str(any_file)}
    args = [a.format(**fill) for a in COMMANDS[command]]
    before = (count_events(handed_off), _checkpoints(handed_off))
    result = _cli(handed_off, *args)
    assert result.returncode == 3, result.stderr
    line = _one_error_line(result.stderr)
    assert KINDS[kind] in line and str(hostile) in line
    assert (count_events(handed_off), _checkpoints(handed_off)) == before
    assert not out.exists()


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_hostile_signing_key_from_the_environment_is_refused(ws: Workspace, handed_off: Path, kind: str) -> None:
    hostile = _hostile(kind, ws.root)
    before = count_events(handed_off)
    result = _cli(handed_off, "seal", env={"LIFECYCLE_SIGNING_KEY": str(hostile)})
    assert result.returncode == 3, result.stderr
    assert KINDS[kind] in _one_error_line(result.stderr)
    assert count_events(handed_off) == before


API = textwrap.dedent("""
    import sys
    from lifecycle_fsm import InputError, Ledger
    with Ledger.open(sys.argv[1], signing_key=sys.argv[2]) as ledger:
        for call in (ledger.seal, lambda: ledger.attest("dpo-v5")):
            try:
                call()
            except InputError as e:
                print(e)
            else:
                sys.exit("no error")
""")


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_api_refuses_a_hostile_signing_key_path(ws: Workspace, handed_off: Path, kind: str) -> None:
    hostile = _hostile(kind, ws.root)
    before = count_events(handed_off)
    result = _run([sys.executable, "-c", API, str(handed_off), str(hostile)])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all(KINDS[kind] in line for line in lines), result.stdout
    assert count_events(handed_off) == before


def test_the_caps_fit_real_files_with_room(ws: Workspace, handed_off: Path, keys: Path) -> None:
    """A real key, signed head and attestation pass, each far below its cap."""
    key, pub = keys / "lifecycle-signing.key", keys / "lifecycle-signing.pub"
    head, attestation = ws.root / "head.json", ws.root / "dpo-v5.intoto.json"
    assert _cli(handed_off, "--signing-key", str(key), "seal", "--out", str(head)).returncode == 0
    assert _cli(handed_off, "--signing-key", str(key), "attest", "dpo-v5", "--out", str(attestation)).returncode == 0
    verified = _cli(handed_off, "verify", "--expect-head", str(head), "--pubkey", str(pub))
    assert verified.returncode == 0, verified.stderr
    checked = _cli(handed_off, "attest", "verify", str(attestation), "--pubkey", str(pub), "--db", str(handed_off))
    assert checked.returncode == 0, checked.stderr
    assert max(key.stat().st_size, pub.stat().st_size) * 100 < MAX_KEY_BYTES
    assert head.stat().st_size * 100 < MAX_SIGNED_HEAD_BYTES
    assert attestation.stat().st_size * 1000 < MAX_ATTESTATION_BYTES


def test_a_key_one_byte_over_the_cap_is_refused(ws: Workspace, handed_off: Path, keys: Path) -> None:
    """The cap holds on a plain regular file too (a PEM padded past 64 KiB)."""
    padded = ws.root / "padded.pub"
    pem = (keys / "lifecycle-signing.pub").read_bytes()
    padded.write_bytes(pem + b"#" * (MAX_KEY_BYTES + 1 - len(pem)))
    result = _cli(handed_off, "verify", "--pubkey", str(padded))
    assert result.returncode == 3
    assert f"over the {MAX_KEY_BYTES}-byte limit" in _one_error_line(result.stderr)
