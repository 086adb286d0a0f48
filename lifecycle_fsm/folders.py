"""Folders a command writes into: created if missing, proven writable, or one `InputError` (exit 3),
never an `OSError` traceback."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from lifecycle_fsm.errors import InputError


def make_folder(folder: str | os.PathLike[str], what: str = "folder") -> Path:
    """Create `folder` and its parents if missing; InputError naming it (`what`) when that fails."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # exist_ok covers folders only: a file (or a dangling link) holds the name
        raise InputError(f"{what} {path} exists and is not a folder") from None
    except OSError as e:
        raise InputError(f"cannot create {what} {path}: {e.strerror or e}") from None
    return path


def prove_writable(folder: str | os.PathLike[str], what: str = "folder") -> Path:
    """`make_folder`, then create and remove a file in it: a folder that takes no file fails here, not later."""
    path = make_folder(folder, what)
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".lifecycle-probe-")
    except OSError as e:
        raise InputError(f"cannot write in {what} {path}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)
    return path
