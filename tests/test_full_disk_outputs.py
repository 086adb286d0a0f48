"""Every file the CLI writes, on a real full filesystem (a 64 KiB tmpfs filled to the last page).

A full disk is the environment's fault: exit 7, one `Error:` line, no traceback, no
0-byte or partial file left to block the next try, and no ledger event for an output
that is not there. Once space is freed, the same command succeeds.

Mounting needs root (CI runs as root); elsewhere these tests skip, unless `CI` is set.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Workspace, cli, count_events, hand_off_dpo

from lifecycle_fsm.audit_records import publish, put_in_place, stage_records
from lifecycle_fsm.errors import InputError, StoreError
from lifecycle_fsm.outputs import output_error, write_atomic


class FullDisk:
    """A small tmpfs at `path`; `fill()` takes every free page, `free()` gives them back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / ".filler"

    def fill(self) -> None:
        """Write zeros until the filesystem refuses the next page."""
        free = os.statvfs(self.path)
        with open(self.filler, "ab", buffering=0) as f:
            f.write(b"\0" * (free.f_bavail * free.f_frsize))
        assert os.statvfs(self.path).f_bavail == 0

    def free(self) -> None:
        self.filler.unlink()

    def files(self, folder: Path | None = None) -> list[str]:
        """Every name under `folder` (default: the whole disk) but the filler."""
        base = folder or self.path
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p != self.filler)


@pytest.fixture
def disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FullDisk]:
    """A 64 KiB tmpfs (or the size a test asks for with indirect parametrisation)."""
    size = getattr(request, "param", "64k")
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the full-disk tests mount a tmpfs and need root, as CI runs")
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield FullDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _one_line_exit_7(result: subprocess.CompletedProcess[str], says: str = "No space left on device") -> None:
    assert result.returncode == 7, (result.returncode, result.stderr)
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def handed_off(ws: Workspace) -> Path:
    return hand_off_dpo(ws)


def test_seal_out_on_a_full_disk_appends_no_seal_and_leaves_no_file(
    disk: FullDisk, handed_off: Path, keys: Path
) -> None:
    key = str(keys / "lifecycle-signing.key")
    out = disk.path / "head.json"
    before = count_events(handed_off)
    disk.fill()
    _one_line_exit_7(cli(handed_off, "--signing-key", key, "seal", "--out", str(out)))
    assert count_events(handed_off) == before and disk.files() == []
    disk.free()
    again = cli(handed_off, "--signing-key", key, "seal", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text())["seq"] == before and count_events(handed_off) == before + 1


def test_attest_out_on_a_full_disk_leaves_no_file(disk: FullDisk, handed_off: Path, keys: Path) -> None:
    args = ("--signing-key", str(keys / "lifecycle-signing.key"), "attest", "dpo-v5", "--out")
    out = disk.path / "dpo.intoto.json"
    disk.fill()
    _one_line_exit_7(cli(handed_off, *args, str(out)))
    assert disk.files() == []
    disk.free()
    assert cli(handed_off, *args, str(out)).returncode == 0 and json.loads(out.read_text())["payload"]


def test_key_new_on_a_full_disk_leaves_no_key(disk: FullDisk, tmp_path: Path) -> None:
    out = disk.path / "keys"
    out.mkdir()
    disk.fill()
    _one_line_exit_7(cli(tmp_path / "unused.db", "key", "new", "--out", str(out)))
    assert disk.files(out) == []  # no 0-byte lifecycle-signing.key that later reads as "not a PEM"
    disk.free()
    assert cli(tmp_path / "unused.db", "key", "new", "--out", str(out)).returncode == 0
    assert (out / "lifecycle-signing.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert (out / "lifecycle-signing.key").stat().st_mode & 0o777 == 0o600


def _audit(ws: Workspace, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        ws.db,
        *extra,
        "audit",
        "--baseline",
        str(ws.root / "sft" / "manifest.json"),
        "--candidates",
        str(ws.root / "dpo-v5" / "manifest.json"),
        "--label",
        "t1",
        "--mode",
        "real_artifact",
        "--root",
        str(ws.root),
        "--out",
        str(out),
        "--replace",
    )


def test_audit_replace_on_a_full_disk_keeps_the_current_records_and_appends_no_seal(
    disk: FullDisk, ws: Workspace, keys: Path
) -> None:
    ws.baseline()
    ws.dpo()
    out = disk.path / "results"
    signing = ("--signing-key", str(keys / "lifecycle-signing.key"))
    first = _audit(ws, out, *signing)
    assert first.returncode == 0, first.stderr
    current = {name: (out / name).read_bytes() for name in disk.files(out)}
    assert len(current) == 2
    before = count_events(ws.db)
    disk.fill()
    _one_line_exit_7(_audit(ws, out, *signing))
    assert {name: (out / name).read_bytes() for name in disk.files(out)} == current  # no .previous, no temp
    with_seals = cli(ws.db, "--json", "verify")
    assert json.loads(with_seals.stdout)["seals"]["count"] == 1  # the first audit's seal only
    assert count_events(ws.db) >= before  # the audit's decisions stand; no seal was appended for absent records
    disk.free()
    again = _audit(ws, out, *signing)
    assert again.returncode == 0, again.stderr
    assert sorted(disk.files(out)) == sorted([*current, *(f"{name}.previous" for name in current)])


def test_decisions_export_on_a_full_disk_is_exit_7_and_leaves_no_partial_pool(disk: FullDisk, handed_off: Path) -> None:
    pool = disk.path / "pool"
    disk.fill()
    _one_line_exit_7(cli(handed_off, "decisions", "export", str(pool)))
    assert disk.files() in ([], ["pool"])  # the folder given may stay; this ledger's sub-folder does not
    disk.free()
    assert cli(handed_off, "decisions", "export", str(pool)).returncode == 0


def test_report_on_a_full_disk_leaves_no_file(disk: FullDisk, handed_off: Path) -> None:
    disk.fill()
    _one_line_exit_7(cli(handed_off, "report", "--out", str(disk.path)))
    assert disk.files() == []


@pytest.mark.parametrize("disk", ["1m"], indirect=True)  # room for the whole copy once freed
def test_migrate_into_a_full_disk_removes_the_destination_it_created(disk: FullDisk, handed_off: Path) -> None:
    dst = disk.path / "copy.db"
    disk.fill()
    _one_line_exit_7(cli(handed_off, "migrate", str(handed_off), str(dst)), says="disk is full")  # SQLite's words
    assert disk.files() == []
    disk.free()
    assert cli(handed_off, "migrate", str(handed_off), str(dst)).returncode == 0


def test_an_exclusive_write_never_overwrites_and_a_failed_one_leaves_nothing(tmp_path: Path) -> None:
    target = write_atomic(tmp_path / "head.json", b"first", exclusive=True)
    with pytest.raises(InputError, match="already exists"):
        write_atomic(target, b"second", exclusive=True)
    assert target.read_bytes() == b"first" and [p.name for p in tmp_path.iterdir()] == ["head.json"]
    with pytest.raises(InputError, match="No such file"):
        write_atomic(tmp_path / "missing" / "x", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["head.json"]


def test_a_full_disk_is_an_environment_error_and_anything_else_bad_input() -> None:
    assert isinstance(output_error("f", OSError(errno.ENOSPC, "No space left on device")), StoreError)
    assert isinstance(output_error("f", OSError(errno.EROFS, "Read-only file system")), StoreError)
    assert isinstance(output_error("f", OSError(errno.EACCES, "Permission denied")), InputError)


def test_replacing_records_keeps_a_current_record_at_every_moment(tmp_path: Path) -> None:
    """The old record is linked to `.previous` before the new one is renamed over it: never absent."""
    record = tmp_path / "r.json"
    publish([(record, b"old")], replace=False)
    staged = stage_records([(record, b"new")], replace=True)
    assert record.read_bytes() == b"old"  # the new bytes are on disk, not yet in place
    assert put_in_place(staged, replace=True) == [tmp_path / "r.json.previous"]
    assert record.read_bytes() == b"new" and (tmp_path / "r.json.previous").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.json.previous"]
