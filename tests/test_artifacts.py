"""Tests for deterministic artifact hashing, on real files (no mocks)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from lifecycle_fsm.artifacts import (
    TREE_FORMAT,
    hash_directory,
    path_escapes_root,
    tree_size,
)
from lifecycle_fsm.errors import ArtifactError

MIB = 1024 * 1024


def sha(data: bytes) -> str:
    """Plain sha256 hex of `data`."""
    return hashlib.sha256(data).hexdigest()


def write(path: Path, data: bytes) -> Path:
    """Create `path` (and its parents) holding `data`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def reference_tree_hash(top: Path) -> str:
    """Independent implementation of the documented stream (plain trees, no links)."""
    lines = []
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            full = Path(dirpath, name)
            rel = os.fsencode(full.relative_to(top).as_posix())
            data = full.read_bytes()
            lines.append((rel, len(data), sha(data)))
    stream = (TREE_FORMAT + "\n").encode()
    for rel, size, digest in sorted(lines):
        stream += rel + b"\0" + str(size).encode() + b"\0" + digest.encode() + b"\n"
    return sha(stream)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small directory tree whose byte order differs from per-component order."""
    top = tmp_path / "model"
    write(top / "a" / "b", b"inner")  # b"a/b" sorts after b"a-b" (0x2f > 0x2d)
    write(top / "a-b", b"dash")
    write(top / "config.json", b'{"x": 1}\n')
    write(top / "caf\u00e9.txt", b"accent")
    write(top / "empty.bin", b"")
    return top


def test_single_file_is_plain_sha256(tmp_path: Path) -> None:
    """A regular file hashes to sha256 of its exact bytes."""
    f = write(tmp_path / "w.bin", b"\x00\r\nbytes\xff")
    assert hash_directory(f) == sha(b"\x00\r\nbytes\xff")
    assert len(hash_directory(f)) == 64 and hash_directory(f) == hash_directory(f).lower()


def test_multi_chunk_file_matches_hashlib(tmp_path: Path) -> None:
    """A 3 MiB file read in 1 MiB chunks hashes like hashlib over the whole."""
    data = os.urandom(3 * MIB + 17)
    f = write(tmp_path / "big.bin", data)
    assert hash_directory(f) == sha(data)


def test_directory_matches_documented_stream(tree: Path) -> None:
    """The module docstring's byte stream, re-implemented here, gives the same hash."""
    assert hash_directory(tree) == reference_tree_hash(tree)
    assert hash_directory(str(tree)) == reference_tree_hash(tree)


def test_documented_stream_literal(tmp_path: Path) -> None:
    """A tiny tree hashes to sha256 of a literally spelled-out stream."""
    write(tmp_path / "d" / "sub" / "x", b"xy")
    write(tmp_path / "d" / "a", b"")
    stream = (
        b"lifecycle-fsm/tree-v1\n"
        + b"a\x000\x00"
        + sha(b"").encode()
        + b"\n"
        + b"sub/x\x002\x00"
        + sha(b"xy").encode()
        + b"\n"
    )
    assert hash_directory(tmp_path / "d") == sha(stream)


def test_creation_order_does_not_matter(tmp_path: Path) -> None:
    """The same files created in opposite orders hash the same."""
    names = ["z", "a", "m/n", "m/a", "B"]
    for i, order in enumerate((names, list(reversed(names)))):
        for name in order:
            write(tmp_path / f"t{i}" / name, name.encode())
    assert hash_directory(tmp_path / "t0") == hash_directory(tmp_path / "t1")


def test_one_byte_change_changes_hash(tree: Path) -> None:
    """Flipping a single byte in one file changes the directory hash."""
    before = hash_directory(tree)
    write(tree / "config.json", b'{"x": 2}\n')
    assert hash_directory(tree) != before


def test_rename_changes_hash(tree: Path) -> None:
    """Renaming a file (same bytes) changes the directory hash."""
    before = hash_directory(tree)
    (tree / "config.json").rename(tree / "config2.json")
    assert hash_directory(tree) != before


def test_empty_directories_ignored(tree: Path) -> None:
    """Adding empty directories, even nested ones, leaves the hash unchanged."""
    before = hash_directory(tree)
    (tree / "empty" / "deeper").mkdir(parents=True)
    (tree / "a" / "nothing").mkdir()
    assert hash_directory(tree) == before


def test_symlink_inside_root_is_followed(tmp_path: Path) -> None:
    """A link inside the tree hashes like a copy; its target's bytes count."""
    linked = tmp_path / "linked"
    write(linked / "data" / "real.bin", b"payload")
    (linked / "alias.bin").symlink_to("data/real.bin")
    copied = tmp_path / "copied"
    write(copied / "data" / "real.bin", b"payload")
    write(copied / "alias.bin", b"payload")
    assert hash_directory(linked) == hash_directory(copied)
    write(linked / "data" / "real.bin", b"payloaD")
    write(copied / "data" / "real.bin", b"payloaD")
    assert hash_directory(linked) != hash_directory(copied)


def test_directory_symlink_inside_root_is_followed(tmp_path: Path) -> None:
    """A directory link inside the tree is walked under the link's own path."""
    top = tmp_path / "top"
    write(top / "real" / "f", b"f")
    (top / "alias").symlink_to("real", target_is_directory=True)
    plain = tmp_path / "plain"
    write(plain / "real" / "f", b"f")
    write(plain / "alias" / "f", b"f")
    assert hash_directory(top) == hash_directory(plain)


def make_hf_cache(base: Path) -> Path:
    """A Hugging Face cache-like repo: snapshot files are links into blobs/."""
    repo = base / "models--x"
    write(repo / "blobs" / "h1", b'{"arch": "tiny"}')
    write(repo / "blobs" / "h2", b"\x01\x02weights")
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/h1")
    (snap / "weights.bin").symlink_to("../../blobs/h2")
    return repo


def test_hf_cache_with_repo_root(tmp_path: Path) -> None:
    """A snapshot hashed with root=models--x equals hashing a plain copy."""
    repo = make_hf_cache(tmp_path)
    snap = repo / "snapshots" / "abc"
    copy = tmp_path / "copy"
    shutil.copytree(snap, copy)  # follows links: plain files
    assert not (copy / "config.json").is_symlink()
    assert hash_directory(snap, root=repo) == hash_directory(copy)
    assert hash_directory(snap, repo) == reference_tree_hash(copy)
    assert tree_size(snap, root=repo) == tree_size(copy)


def test_hf_cache_with_default_root_fails(tmp_path: Path) -> None:
    """Without root the blob links leave the snapshot and are refused by name (the first one listed: the
    file system's order)."""
    snap = make_hf_cache(tmp_path) / "snapshots" / "abc"
    named = r"/snapshots/abc/(config\.json|weights\.bin) -> "
    with pytest.raises(ArtifactError, match=named) as info:
        hash_directory(snap)
    assert "outside the allowed root" in str(info.value)
    with pytest.raises(ArtifactError, match=named):
        tree_size(snap)


def test_symlink_to_outside_fails(tmp_path: Path) -> None:
    """A link whose target is outside the tree is an error naming the link."""
    write(tmp_path / "secret", b"secret")
    top = tmp_path / "top"
    write(top / "ok", b"ok")
    (top / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(ArtifactError, match=r"outside the allowed root: .*top/leak ->"):
        hash_directory(top)


def test_top_level_symlink_default_root(tmp_path: Path) -> None:
    """When `path` itself is a link and root is None, its target is the root."""
    write(tmp_path / "real" / "f", b"f")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    assert hash_directory(tmp_path / "link") == hash_directory(tmp_path / "real")


def test_top_level_symlink_outside_root_fails(tmp_path: Path) -> None:
    """A `path` that is a link leading outside the given root is refused."""
    write(tmp_path / "outside" / "f", b"f")
    (tmp_path / "root").mkdir()
    link = tmp_path / "root" / "link"
    link.symlink_to(tmp_path / "outside", target_is_directory=True)
    refused = r"outside the allowed root: .*root/link ->"
    with pytest.raises(ArtifactError, match=refused):
        hash_directory(link, root=tmp_path / "root")


def test_directory_loop_fails(tmp_path: Path) -> None:
    """A directory link to its parent is reported as a loop naming the link."""
    top = tmp_path / "top"
    write(top / "sub" / "f", b"f")
    (top / "sub" / "up").symlink_to("..", target_is_directory=True)
    with pytest.raises(ArtifactError, match=r"symlink loop: .*sub/up$"):
        hash_directory(top)


def test_realpath_cycle_fails(tmp_path: Path) -> None:
    """Two links pointing at each other are reported as a loop."""
    top = tmp_path / "top"
    top.mkdir()
    (top / "a").symlink_to("b")
    (top / "b").symlink_to("a")
    with pytest.raises(ArtifactError, match=r"symlink loop: .*top/[ab]$"):
        hash_directory(top)


def test_dangling_symlink_fails(tmp_path: Path) -> None:
    """A link to nothing is an error naming the link."""
    top = tmp_path / "top"
    write(top / "f", b"f")
    (top / "ghost").symlink_to("missing")
    with pytest.raises(ArtifactError, match=r"dangling symlink: .*top/ghost$"):
        hash_directory(top)


def test_dotdot_escape_fails(tmp_path: Path) -> None:
    """A path that climbs out of root with `..` is refused by name."""
    root = tmp_path / "root"
    write(root / "f", b"f")
    write(tmp_path / "other" / "g", b"g")
    escaping = root / ".." / "other"
    with pytest.raises(ArtifactError, match=r"path escapes root: .*root/\.\./other"):
        hash_directory(escaping, root=root)


def test_a_root_that_is_no_folder_is_named_not_blamed_on_the_path(tmp_path: Path) -> None:
    """Every path lies outside a root that does not exist: say that, not "path escapes root"."""
    write(tmp_path / "f", b"f")
    with pytest.raises(ArtifactError, match=r"^root .*/nowhere does not exist$"):
        hash_directory(tmp_path / "f", root=tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match=r"^root .*/f is not a folder$"):
        hash_directory(tmp_path / "f" / ".." / "g", root=tmp_path / "f")


def test_missing_path_fails(tmp_path: Path) -> None:
    """A path that does not exist is an ArtifactError (a ValueError) naming it."""
    missing = tmp_path / "nope"
    with pytest.raises(ArtifactError, match=r"no such file or directory: .*nope"):
        hash_directory(missing)
    with pytest.raises(ValueError, match=r"nope"):
        hash_directory(missing)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_fails_without_blocking(tmp_path: Path) -> None:
    """A FIFO in the tree is refused by name and never opened (no hang)."""
    top = tmp_path / "top"
    write(top / "f", b"f")
    os.mkfifo(top / "pipe")
    with pytest.raises(ArtifactError, match=r"pipe"):
        hash_directory(top)
    with pytest.raises(ArtifactError, match=r"pipe"):
        hash_directory(top / "pipe")
    with pytest.raises(ArtifactError, match=r"pipe"):
        tree_size(top)


def test_file_changing_while_hashed_fails(tmp_path: Path) -> None:
    """Appending a byte after the first chunk is detected and named."""
    big = write(tmp_path / "top" / "big.bin", b"\x00" * (MIB + 10))
    calls: list[int] = []

    def grow(n: int) -> None:
        """Append one byte to the file right after the first chunk is read."""
        calls.append(n)
        if len(calls) == 1:
            with big.open("ab") as fh:
                fh.write(b"!")

    with pytest.raises(ArtifactError, match=r"file changed while hashing: .*big\.bin"):
        hash_directory(tmp_path / "top", progress=grow)
    calls.clear()
    with pytest.raises(ArtifactError, match=r"file changed while hashing"):
        hash_directory(big, progress=grow)


def test_progress_total_equals_tree_size(tree: Path) -> None:
    """Progress callbacks sum to tree_size, in chunks of at most 1 MiB."""
    write(tree / "big.bin", os.urandom(2 * MIB + 5))
    seen: list[int] = []
    hash_directory(tree, progress=seen.append)
    assert sum(seen) == tree_size(tree)
    assert max(seen) == MIB
    single: list[int] = []
    hash_directory(tree / "big.bin", progress=single.append)
    assert single == [MIB, MIB, 5]
    assert tree_size(tree / "big.bin") == 2 * MIB + 5


def test_path_escapes_root(tmp_path: Path) -> None:
    """Lexical escape check: `..` and siblings escape; the root and below do not."""
    root = tmp_path / "root"
    assert not path_escapes_root(root, root)
    assert not path_escapes_root(root / "a" / "b", root)
    assert not path_escapes_root(root / "a" / ".." / "b", root)
    assert path_escapes_root(root / ".." / "x", root)
    assert path_escapes_root(tmp_path / "root2", root)  # prefix is not containment
    assert path_escapes_root(tmp_path, str(root))


def test_path_escapes_root_ignores_symlinks(tmp_path: Path) -> None:
    """A link inside root does not count as escaping: symlinks are not resolved."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path, target_is_directory=True)
    assert not path_escapes_root(root / "out", root)
