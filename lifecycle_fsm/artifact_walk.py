"""Walking an artifact tree by the hashing rules, before a byte is read, and where a path leads.

Symlinks are followed only into the allowed root; links leading outside, dangling links, loops and
special files are an `ArtifactError` naming the path. Directories are listed through descriptors
opened relative to their checked parent (O_NOFOLLOW, checked by device and inode), so a component
swapped for a link after it was checked is an error, never followed. On Linux `/proc/self/fd/N` says
where an opened path led, cheaper than `os.path.realpath`'s `lstat` per component, and the walk keeps
that descriptor, so the file whose place it checks is the file it stats, whatever is renamed meanwhile.
"""

from __future__ import annotations

import errno
import os
import stat

from lifecycle_fsm.errors import ArtifactError, ArtifactUnreadable

StrPath = str | os.PathLike[str]
_O_PATH = getattr(os, "O_PATH", 0)
_PROC_FD = "/proc/self/fd/"
_DELETED = " (deleted)"  # what /proc shows for a file unlinked since it was opened
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
# Directories are listed through descriptors where the system can (Linux, macOS, BSDs); elsewhere by path.
_FD_WALK = os.scandir in os.supports_fd and os.open in os.supports_dir_fd
# What open(2) says when O_NOFOLLOW met a link (Linux ELOOP, FreeBSD EMLINK, NetBSD EFTYPE).
NOFOLLOW_ERRNOS = {errno.ELOOP, errno.EMLINK, getattr(errno, "EFTYPE", errno.ELOOP)}


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
        fd = _open_path(path)
    except OSError:
        fd = None
    if fd is not None:
        try:
            target = _fd_path(fd)
        finally:
            os.close(fd)
        if target is not None:
            return target
    return os.path.realpath(path)


def _open_path(name: str, dir_fd: int | None = None) -> int | None:
    """An O_PATH descriptor of what `name` (relative to `dir_fd`) leads to, links followed (nothing is
    read, no device opened); None without O_PATH or /proc. OSError as `os.open` raises it."""
    if not _O_PATH:
        return None
    return os.open(name, _O_PATH | os.O_CLOEXEC, dir_fd=dir_fd)


def _fd_path(fd: int) -> str | None:
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


# What the environment, not the artifact, is to blame for: the check that meets it is inconclusive.
_ENVIRONMENT_ERRNOS = {
    getattr(errno, name)
    for name in ("EACCES", "EPERM", "EIO", "ENXIO", "ENODEV", "ESTALE", "ENOTCONN", "ETIMEDOUT", "ENOMEDIUM")
    if hasattr(errno, name)
}


def os_error(what: str, shown: str, exc: OSError) -> ArtifactError:
    """`cannot <what> <shown>: <why>`, an `ArtifactUnreadable` when the environment is to blame."""
    cls = ArtifactUnreadable if exc.errno in _ENVIRONMENT_ERRNOS else ArtifactError
    return cls(f"cannot {what} {shown}: {exc.strerror}")


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return a.st_ino == b.st_ino and a.st_dev == b.st_dev


# Where a path leads: (real path, its stat, an O_PATH descriptor of it or None).
_Found = tuple[str, os.stat_result, int | None]


def _link_error(exc: OSError, shown: str) -> ArtifactError:
    if exc.errno == errno.ELOOP:
        return ArtifactError(f"symlink loop: {shown}")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ArtifactError(f"dangling symlink: {shown}")
    return os_error("resolve symlink", shown, exc)


def _check_inside(target: str, allowed: str, shown: str) -> None:
    if not inside(target, allowed):
        raise ArtifactError(f"symlink leads outside the allowed root: {shown} -> {target}")


def _follow(path: str, shown: str, allowed: str, name: str = "", dir_fd: int | None = None) -> _Found:
    """Where `path` (`name` in the directory open as `dir_fd`) leads, links followed; refused outside
    `allowed`. The caller closes the descriptor: on Linux it answers both where (/proc) and what (fstat)."""
    try:
        handle = _open_path(path if dir_fd is None else name, dir_fd)
    except OSError as exc:
        raise _link_error(exc, shown) from None
    if handle is not None:
        try:
            target = _fd_path(handle)
            if target is not None:
                _check_inside(target, allowed, shown)
                return target, os.fstat(handle), handle
        except BaseException:
            os.close(handle)
            raise
        os.close(handle)
    try:  # no O_PATH or /proc: Python resolves the link
        target = os.path.realpath(path, strict=True)
    except OSError as exc:
        raise _link_error(exc, shown) from (None if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR) else exc)
    _check_inside(target, allowed, shown)
    return target, os.stat(target), None


def _open_dir(
    real: str, st: os.stat_result, shown: str, name: str = "", dir_fd: int | None = None, handle: int | None = None
) -> int | str:
    """A descriptor of the directory the walk stat'ed as `st` (or, where descriptors cannot be listed,
    its path): opened as `name` in `dir_fd`, through a link's O_PATH `handle`, or (the top) as `real`,
    never following a last link, and checked by (device, inode)."""
    if not _FD_WALK:
        return real
    try:
        if handle is not None:
            fd = os.open(".", _DIR_FLAGS, dir_fd=handle)
        elif dir_fd is not None:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        else:
            fd = os.open(real, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in NOFOLLOW_ERRNOS | {errno.ENOTDIR, errno.ENOENT}:
            raise ArtifactError(f"replaced since it was checked (not the directory the walk saw): {shown}") from None
        raise os_error("list", shown, exc) from exc
    try:
        same = same_file(os.fstat(fd), st)
    except OSError as exc:
        os.close(fd)
        raise os_error("list", shown, exc) from exc
    if not same:
        os.close(fd)
        raise ArtifactError(f"replaced since it was checked (not the directory the walk saw): {shown}")
    return fd


# One collected file: (relative path bytes, real path to open, path for messages, its stat when
# collected: what a digest's re-use compares and what the descriptor opened to read it must be).
Entry = tuple[bytes, str, str, os.stat_result]


def _walk(
    where: int | str, real_dir: str, shown_dir: str, prefix: bytes, allowed: str, stack: set[str], out: list[Entry]
) -> None:
    """Collect regular files under `real_dir` (listed through `where`, what `_open_dir` gave); `stack`:
    realpaths of open ancestors."""
    dir_fd = where if isinstance(where, int) else None
    try:
        with os.scandir(where) as it:
            entries = list(it)
    except OSError as exc:
        raise os_error("list", shown_dir, exc) from exc
    for entry in entries:
        name = entry.name
        shown = os.path.join(shown_dir, name)
        rel = prefix + os.fsencode(name)
        path = os.path.join(real_dir, name)
        handle = None
        try:
            try:
                linked = entry.is_symlink()
                if linked:
                    real, st, handle = _follow(path, shown, allowed, name, dir_fd)
                else:
                    real = path
                    st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                raise os_error("stat", shown, exc) from exc
            if stat.S_ISDIR(st.st_mode):
                if real in stack:
                    raise ArtifactError(f"symlink loop: {shown}")
                # A link's directory: through its handle, or (no O_PATH) by its resolved path.
                child = _open_dir(real, st, shown, name, None if linked else dir_fd, handle)
                stack.add(real)
                try:
                    _walk(child, real, shown, rel + b"/", allowed, stack, out)
                finally:
                    stack.discard(real)
                    if isinstance(child, int):
                        os.close(child)
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, real, shown, st))
            else:
                raise ArtifactError(f"special file (not regular or a directory): {shown}")
        finally:
            if handle is not None:
                os.close(handle)


def _missing_root(root: StrPath | None) -> ArtifactUnreadable | None:
    """An absent root is an unmounted volume as often as a typo: not the artifact's fault."""
    if root is None or (problem := folder_problem(root)) is None:
        return None
    return ArtifactUnreadable(f"root {os.fspath(root)} {problem}")


def collect(path: StrPath, root: StrPath | None) -> tuple[bool, list[Entry]]:
    """Check `path` against the rules; return (is_directory, files in stream order)."""
    shown = os.fspath(path)
    if root is not None and path_escapes_root(shown, root):
        # Asked only here, so a sound root costs no stat: every path "escapes" a root that is not there.
        raise _missing_root(root) or ArtifactError(f"path escapes root: {shown}")
    try:
        own = os.lstat(shown)  # one call says: there, a link or not, and (not a link) what it is
    except (FileNotFoundError, NotADirectoryError):
        raise _missing_root(root) or ArtifactError(f"no such file or directory: {shown}") from None
    except OSError as exc:
        raise os_error("stat", shown, exc) from exc
    is_link = stat.S_ISLNK(own.st_mode)
    handle = None
    if root is None and not is_link:
        # The path is its own root: resolved only if it is a directory to walk.
        if stat.S_ISREG(own.st_mode):
            return False, [(b"", shown, shown, own)]
        real = allowed = real_path(shown)
        st = own
    else:
        allowed = real_path(os.fspath(root) if root is not None else shown)
        try:  # a link, or an intermediate directory that links out, is refused naming the path
            real, st, handle = _follow(shown, shown, allowed)
        except OSError as exc:
            raise os_error("stat", shown, exc) from exc
    try:
        if stat.S_ISREG(st.st_mode):
            return False, [(b"", real, shown, st)]
        if not stat.S_ISDIR(st.st_mode):
            raise ArtifactError(f"special file (not regular or a directory): {shown}")
        out: list[Entry] = []
        top = _open_dir(real, st, shown, handle=handle)
        try:
            _walk(top, real, shown, b"", allowed, {real}, out)
        finally:
            if isinstance(top, int):
                os.close(top)
    finally:
        if handle is not None:
            os.close(handle)
    out.sort(key=lambda e: e[0])
    return True, out
