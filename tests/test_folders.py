"""`lifecycle_fsm.folders`: an output folder that cannot be made or written is one InputError, never an OSError."""

from __future__ import annotations

from pathlib import Path

import pytest

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.folders import make_folder, prove_writable


def test_a_missing_folder_is_made_with_its_parents(tmp_path: Path) -> None:
    made = prove_writable(tmp_path / "a" / "b", "records folder")
    assert made.is_dir() and list(made.iterdir()) == []  # the probe file is gone
    assert make_folder(made) == made  # an existing folder is fine


def test_a_file_in_the_way(tmp_path: Path) -> None:
    """Under a file (NotADirectoryError) or at a file's name (FileExistsError): InputError naming the folder."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=r"cannot create records folder .*afile/sub: Not a directory"):
        prove_writable(tmp_path / "afile" / "sub", "records folder")
    with pytest.raises(InputError, match=r"key folder .*afile exists and is not a folder"):
        make_folder(tmp_path / "afile", "key folder")


def test_a_read_only_place(read_only_folder: Path) -> None:
    """A folder that cannot be created, and an existing one that takes no file."""
    locked, denied = read_only_folder, "(Permission denied|Read-only file system)"
    with pytest.raises(InputError, match=rf"cannot create folder .*locked/sub: {denied}"):
        make_folder(locked / "sub")
    with pytest.raises(InputError, match=rf"cannot write in folder .*locked: {denied}"):
        prove_writable(locked)
