"""Where an artifact path leads: containment under a root, and symlinks resolved.

Every check resolves its artifact paths again (a link may have moved since the last
read), so this is on each `check`'s path. `os.path.realpath` resolves one component
per `lstat` in Python (~16 us for a path seven deep); on Linux the kernel already did
that work when it opened the path, and `/proc/self/fd/N` says where it led (~5 us).
`real_path` asks the kernel for a path that opens, and `os.path.realpath` for anything
else (a path that does not exist, no /proc, another system), so both give one answer.
"""

from __future__ import annotations

import os

__all__ = ["folder_problem", "inside", "path_escapes_root", "real_path"]

StrPath = str | os.PathLike[str]

_O_PATH = getattr(os, "O_PATH", 0)
_PROC_FD = "/proc/self/fd/"
_DELETED = " (deleted)"  # what /proc shows for a file unlinked since it was opened


def inside(path: str, root: str) -> bool:
    """True when absolute, normalised `path` is `root` or below it (by component, not prefix)."""
    if os.name == "nt":  # case-insensitive names and drives: let ntpath compare
        try:
            return os.path.commonpath([path, root]) == root
        except ValueError:  # different drives
            return False
    if path == root:
        return True
    return path.startswith(root if root.endswith("/") else root + "/")


def folder_problem(path: StrPath) -> str | None:
    """Why `path` cannot be a root to hash under ("does not exist", "is not a folder"), or None."""
    if os.path.isdir(path):
        return None
    return "is not a folder" if os.path.lexists(path) else "does not exist"


def path_escapes_root(path: StrPath, root: StrPath) -> bool:
    """True when `path`, normalised lexically (no symlinks resolved), leaves `root`."""
    return not inside(os.path.abspath(path), os.path.abspath(root))


def real_path(path: str) -> str:
    """`os.path.realpath(path)`: from the kernel when the path opens (Linux), else from Python."""
    if _O_PATH:
        try:
            fd = os.open(path, _O_PATH | os.O_CLOEXEC)
        except OSError:
            return os.path.realpath(path)
        try:
            target = os.readlink(_PROC_FD + str(fd))
        except OSError:  # no /proc: say so once, and stop asking
            _no_proc()
            target = ""
        finally:
            os.close(fd)
        # Anything but a plain absolute path ("(unreachable)/..." outside a chroot, a
        # name unlinked meanwhile) is left to Python's answer.
        if target.startswith("/") and not target.endswith(_DELETED):
            return target
    return os.path.realpath(path)


def _no_proc() -> None:
    global _O_PATH  # noqa: PLW0603 - a fact about this system, found once
    if not os.path.isdir(_PROC_FD):
        _O_PATH = 0
