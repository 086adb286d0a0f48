"""An entry swapped after the walk checked it is an error naming it, never a hash of something else.

The walk checks each entry against the allowed root; the bytes are read later. Between the
two, a writer inside the root can put a symlink (or a FIFO, or another file) where a
checked file or directory was. These tests make that race deterministic on real files:
the hash of a large first file reports progress after its first chunk, and the progress
callback (the same hook the CLI's progress bar uses) swaps a later entry right then. The
walk itself is raced through `os.scandir` (wrapped to swap before it lists a directory).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle_fsm import artifact_walk
from lifecycle_fsm.artifacts import DigestCache, hash_directory, hash_tree
from lifecycle_fsm.errors import ArtifactError

MIB = 1024 * 1024
SECRET = b"the secret outside the root\n"


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# How the walk finds things: Linux (O_PATH descriptors, /proc says where), a system without
# O_PATH (macOS, BSDs: realpath, directories still listed through descriptors), and one
# that cannot list a descriptor either (Windows: everything by path).
MODES = ["kernel", "no_o_path", "by_path"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param in ("no_o_path", "by_path"):
        monkeypatch.setattr(artifact_walk, "_O_PATH", 0)
    if request.param == "by_path":
        monkeypatch.setattr(artifact_walk, "_FD_WALK", False)
    return str(request.param)


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """root/adapter/{a.bin (2 MiB + 1: hashed first, in 3 chunks), sub/z.txt, z.txt}; outside/ holds a secret."""
    write(tmp_path / "root" / "adapter" / "a.bin", b"\x00" * (2 * MIB + 1))
    write(tmp_path / "root" / "adapter" / "sub" / "z.txt", b"inside\n")
    write(tmp_path / "root" / "adapter" / "z.txt", b"inside\n")
    write(tmp_path / "outside" / "secret", SECRET)
    write(tmp_path / "outside" / "sub" / "z.txt", SECRET)
    return tmp_path


def once(action: Callable[[], None]) -> Callable[[int], None]:
    """A progress callback that runs `action` after the first chunk read (a.bin's), then nothing."""
    done: list[bool] = []

    def progress(_n: int) -> None:
        if not done:
            done.append(True)
            action()

    return progress


def swap_file_for_outside_link(base: Path) -> None:
    """The tester's attack: adapter/z.txt becomes a link to ../../outside/secret."""
    z = base / "root" / "adapter" / "z.txt"
    z.unlink()
    z.symlink_to(os.path.join("..", "..", "outside", "secret"))


def swap_directory_for_outside_link(base: Path) -> None:
    """adapter/sub moves away and a link to outside/sub (holding its own z.txt) takes its name."""
    sub = base / "root" / "adapter" / "sub"
    sub.rename(sub.with_name("sub.old"))
    sub.symlink_to(base / "outside" / "sub", target_is_directory=True)


def test_file_swapped_for_a_link_outside_after_the_walk_is_refused(layout: Path, mode: str) -> None:
    """z.txt replaced by a link to a file outside the root while a.bin is read: error naming z.txt."""
    adapter, root = layout / "root" / "adapter", layout / "root"
    before = hash_directory(adapter, root)
    with pytest.raises(ArtifactError, match=r"adapter/z\.txt$"):
        hash_directory(adapter, root, progress=once(lambda: swap_file_for_outside_link(layout)))
    # And the default root (the adapter itself) likewise.
    (adapter / "z.txt").unlink()
    write(adapter / "z.txt", b"inside\n")
    assert hash_directory(adapter, root) == before
    with pytest.raises(ArtifactError, match=r"adapter/z\.txt$"):
        hash_directory(adapter, progress=once(lambda: swap_file_for_outside_link(layout)))


def test_directory_component_swapped_for_a_link_outside_after_the_walk_is_refused(layout: Path, mode: str) -> None:
    """sub/ replaced by a link to outside/sub while a.bin is read: error naming sub/z.txt."""
    adapter, root = layout / "root" / "adapter", layout / "root"
    with pytest.raises(ArtifactError, match=r"adapter/sub/z\.txt$"):
        hash_directory(adapter, root, progress=once(lambda: swap_directory_for_outside_link(layout)))


def test_a_swapped_file_is_not_hashed_by_the_digest_cache_either(layout: Path) -> None:
    """`check` on a long-lived Ledger hashes through DigestCache: the same swap is refused there."""
    adapter, root = layout / "root" / "adapter", layout / "root"
    cache = DigestCache(lambda: "2026-12-01T00:00:00.000000Z")
    real_read = os.read
    calls: list[int] = []

    def read_then_swap(fd: int, n: int) -> bytes:
        """The cache hashes without progress: swap right after a.bin's first chunk is read."""
        data = real_read(fd, n)
        calls.append(len(data))
        if len(calls) == 1:
            swap_file_for_outside_link(layout)
        return data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "read", read_then_swap)
        with pytest.raises(ArtifactError, match=r"adapter/z\.txt$"):
            cache.hash_tree(adapter, root)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_file_swapped_for_a_fifo_after_the_walk_is_refused_without_blocking(layout: Path) -> None:
    adapter = layout / "root" / "adapter"

    def fifo() -> None:
        (adapter / "z.txt").unlink()
        os.mkfifo(adapter / "z.txt")

    with pytest.raises(ArtifactError, match=r"adapter/z\.txt$"):
        hash_directory(adapter, progress=once(fifo))


def test_file_replaced_by_another_file_after_the_walk_is_refused(layout: Path) -> None:
    """Not the entry the walk checked (another inode under its name): refused, not hashed."""
    adapter = layout / "root" / "adapter"

    def replace() -> None:
        write(adapter / "z.new", b"swapped in\n").replace(adapter / "z.txt")

    with pytest.raises(ArtifactError, match=r"adapter/z\.txt$"):
        hash_directory(adapter, progress=once(replace))


def test_directory_swapped_while_the_walk_descends_is_refused(layout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sub/ swapped for a link outside after the walk saw it as a directory, before it is listed."""
    adapter, root = layout / "root" / "adapter", layout / "root"
    real_scandir = os.scandir
    calls: list[Any] = []

    def scandir_after_swap(where: Any) -> Iterator[os.DirEntry[Any]]:
        """The second listing is sub/'s (the walk lists adapter/ first): swap just before it."""
        calls.append(where)
        if len(calls) == 2:
            swap_directory_for_outside_link(layout)
        return real_scandir(where)

    monkeypatch.setattr(os, "scandir", scandir_after_swap)
    with pytest.raises(ArtifactError, match=r"adapter/sub(/z\.txt)?$"):
        hash_tree(adapter, root)
    assert len(calls) == 2


def test_links_inside_the_root_still_hash_after_a_large_file(layout: Path, mode: str) -> None:
    """Links that stay inside the root (file and directory, HF-cache style) hash like copies."""
    adapter, root = layout / "root" / "adapter", layout / "root"
    write(root / "blobs" / "w", b"weights")
    (adapter / "w.bin").symlink_to(os.path.join("..", "blobs", "w"))
    (adapter / "sub2").symlink_to("sub", target_is_directory=True)
    listing = hash_tree(adapter, root).files
    assert listing is not None
    by_path = {p: h for p, _, h in listing}
    assert by_path["w.bin"] == hashlib.sha256(b"weights").hexdigest()
    assert by_path["sub2/z.txt"] == by_path["sub/z.txt"] == hashlib.sha256(b"inside\n").hexdigest()


def test_link_rules_hold_in_every_mode(tmp_path: Path, mode: str) -> None:
    """Outside, dangling, looping links and a top-level link out are refused by name however the walk runs."""
    top = tmp_path / "root" / "top"
    write(top / "f", b"f")
    (top / "d").mkdir()
    write(tmp_path / "secret", SECRET)
    cases = [
        ("leak", tmp_path / "secret", r"outside the allowed root: .*top/leak -> "),
        ("ghost", Path("missing"), r"dangling symlink: .*top/ghost$"),
        ("d/up", Path(".."), r"symlink loop: .*top/d/up$"),
    ]
    for name, target, refused in cases:
        (top / name).symlink_to(target)
        with pytest.raises(ArtifactError, match=refused):
            hash_directory(top)
        (top / name).unlink()
    (top / "loop_a").symlink_to("loop_b")
    (top / "loop_b").symlink_to("loop_a")
    with pytest.raises(ArtifactError, match=r"symlink loop: .*top/loop_[ab]$"):
        hash_directory(top)
    (top / "loop_a").unlink()
    (top / "loop_b").unlink()
    out = tmp_path / "root" / "out"
    out.symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ArtifactError, match=r"outside the allowed root: .*root/out -> "):
        hash_directory(out, root=tmp_path / "root")
    with pytest.raises(ArtifactError, match=r"outside the allowed root: .*root/out/secret -> "):
        hash_directory(out / "secret", root=tmp_path / "root")
    assert hash_directory(top) == hash_directory(top, root=tmp_path / "root")
