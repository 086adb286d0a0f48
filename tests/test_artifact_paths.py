"""`real_path` gives `os.path.realpath`'s answer; `inside` gives `commonpath`'s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lifecycle_fsm import artifact_walk
from lifecycle_fsm.artifact_walk import inside, real_path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Files, directories and links of every kind the artifact walk meets."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "sub" / "f.bin").write_bytes(b"x")
    (tmp_path / "dirlink").symlink_to(tmp_path / "real")
    (tmp_path / "rel_dirlink").symlink_to("real/sub")
    (tmp_path / "filelink").symlink_to(tmp_path / "real" / "sub" / "f.bin")
    (tmp_path / "chain").symlink_to("filelink")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop_a").symlink_to("loop_b")
    (tmp_path / "loop_b").symlink_to("loop_a")
    return tmp_path


CASES = [
    "real",
    "real/sub/f.bin",
    "dirlink",
    "dirlink/sub/f.bin",
    "rel_dirlink/f.bin",
    "filelink",
    "chain",
    "dirlink/sub/../sub/f.bin",
    "rel_dirlink/../sub",
    "real/./sub//f.bin",
    "dangling",
    "loop_a",
    "nowhere/x",
    "real/sub/f.bin/not_a_dir",
]


@pytest.mark.parametrize("relative", CASES)
def test_real_path_is_realpath(tree: Path, relative: str) -> None:
    """Absolute and relative spellings, links through directories, `..` after a link, missing paths."""
    path = f"{tree}/{relative}"
    assert real_path(path) == os.path.realpath(path)


def test_real_path_of_a_relative_path(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree / "dirlink")
    for relative in ("sub/f.bin", "../filelink", ".", "sub/../../rel_dirlink"):
        assert real_path(relative) == os.path.realpath(relative)


def test_real_path_without_the_kernel_answer(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /proc cannot answer (another system), Python's realpath does."""
    monkeypatch.setattr(artifact_walk, "_O_PATH", 0)
    assert real_path(f"{tree}/dirlink/sub/f.bin") == str(tree.resolve() / "real" / "sub" / "f.bin")


@pytest.mark.parametrize(
    ("path", "root", "expected"),
    [
        ("/a/b", "/a/b", True),
        ("/a/b/c", "/a/b", True),
        ("/a/bc", "/a/b", False),
        ("/a", "/a/b", False),
        ("/x", "/", True),
        ("/", "/", True),
        ("/a/b/", "/a/b/", True),
        ("/a/b/c", "/a/b/", True),
    ],
)
def test_inside_is_by_component(path: str, root: str, expected: bool) -> None:
    assert inside(path, root) is expected
    assert (os.path.commonpath([path, root]) == os.path.normpath(root)) is expected
