"""Where an artifact path leads: containment under a root, and symlinks resolved.

On Linux `/proc/self/fd/N` says where an opened path led, cheaper than `os.path.realpath`'s `lstat`
per component; `open_path` and `fd_path` let the artifact walk keep that descriptor, so the file
whose place it checks is the file it stats, whatever is renamed meanwhile.
"""

from __future__ import annotations

import os

__all__ = ["fd_path", "folder_problem", "inside", "open_path", "path_escapes_root", "real_path"]

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
    try:
        fd = open_path(path)
    except OSError:
        fd = None
    if fd is not None:
        try:
            target = fd_path(fd)
        finally:
            os.close(fd)
        if target is not None:
            return target
    return os.path.realpath(path)


def open_path(name: str, dir_fd: int | None = None) -> int | None:
    """An O_PATH descriptor of what `name` (relative to `dir_fd`) leads to, links followed (nothing is
    read, no device opened); None without O_PATH or /proc. OSError as `os.open` raises it."""
    if not _O_PATH:
        return None
    return os.open(name, _O_PATH | os.O_CLOEXEC, dir_fd=dir_fd)


def fd_path(fd: int) -> str | None:
    """Where the kernel says descriptor `fd` is (no link in it), or None when it cannot say a plain path."""
    global _O_PATH  # noqa: PLW0603 - a fact about this system, found once
    try:
        target = os.readlink(_PROC_FD + str(fd))
    except OSError:
        if not os.path.isdir(_PROC_FD):  # no /proc: stop asking
            _O_PATH = 0
        return None
    # Anything but a plain absolute path ("(unreachable)/...", a name unlinked meanwhile) is left to the caller.
    if target.startswith("/") and not target.endswith(_DELETED):
        return target
    return None
