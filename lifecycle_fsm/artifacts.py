"""Deterministic content hashes for model artifacts (a file or a directory tree).

The hash is a product contract: another tool must be able to recompute it, so the
exact byte stream is specified here. All digests are SHA-256, bare lowercase hex
(64 characters), over the exact bytes on disk with no normalisation.

A single regular file hashes to ``sha256(file bytes)``.

A directory hashes to ``sha256(stream)`` where ``stream`` is::

    b"lifecycle-fsm/tree-v1\\n"
    then, for every regular file under the directory (recursively),
    sorted by RELPATH (as bytes):
        RELPATH + b"\\0" + SIZE + b"\\0" + HEX + b"\\n"

* ``RELPATH`` is the file's path relative to the hashed directory, ``/``-separated,
  encoded with ``os.fsencode`` (UTF-8; undecodable names keep their raw bytes).
  Sorting compares these bytes, so it does not depend on locale or creation order.
* ``SIZE`` is the file's length in bytes as decimal ASCII (no padding).
* ``HEX`` is the file's own sha256 as 64 lowercase hex ASCII characters.

Directories contribute no line of their own, so empty directories are ignored.

Symlinks are followed only when their fully resolved target lies inside the
allowed root (``root`` if given, else the hashed path itself, both resolved with
``os.path.realpath``); the target's content is hashed under the link's own
relative path, so a link and a copy give the same hash. Links leading outside,
dangling links, link loops and special files (FIFOs, sockets, devices) raise
`ArtifactError` naming the offending path, as does a file that changes while it
is read (size or mtime differs before/after, or bytes read != size).

The bytes hashed are those of the entry the walk checked. Every path the walk keeps
ends in no link (a link's resolved target is kept), so a file is opened with
O_NOFOLLOW and its descriptor must be the (device, inode) the walk stat'ed and a regular
file; directories are listed through descriptors opened relative to their checked parent
(O_NOFOLLOW | O_DIRECTORY, same check), and on Linux a link is resolved through one O_PATH
descriptor (where it leads from /proc, what it is from fstat). A file or directory
component swapped for a link, a FIFO or another file after it was checked raises
`ArtifactError` naming the entry ("replaced since it was checked"), never hashes
something else. Residual: a directory component swapped between the walk and the open
makes the open follow it (its bytes are refused, not read, by the inode check).

`hash_tree` returns the same hash with the per-file listing it was built from
(relative path, size, sha256 of each file), so a check can record which files a
tampered folder differs in. Above `MAX_LISTED_FILES` files only the tree hash and
the file count are kept (the listing would dwarf the event that carries it).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from lifecycle_fsm.artifact_paths import fd_path, folder_problem, inside, open_path, path_escapes_root, real_path
from lifecycle_fsm.errors import ArtifactError

__all__ = [
    "DigestCache",
    "MAX_LISTED_FILES",
    "TREE_FORMAT",
    "TreeDigest",
    "hash_directory",
    "hash_file",
    "hash_tree",
    "path_escapes_root",
    "tree_size",
]

TREE_FORMAT = "lifecycle-fsm/tree-v1"
CHUNK_SIZE = 1024 * 1024
# Above this many files a directory's listing is not kept, only its hash and count.
MAX_LISTED_FILES = 1000

Progress = Callable[[int], None]
StrPath = str | os.PathLike[str]
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# A file the walk checked is opened without following a link in its last component: every
# path the walk keeps ends in no link (a link's target is kept, not the link), so a link
# there now was put there since the check. O_NONBLOCK: a FIFO swapped in does not hang.
_ENTRY_FLAGS = _OPEN_FLAGS | _O_NOFOLLOW
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_NOFOLLOW
# Directories are listed through descriptors opened relative to their checked parent where
# the system can (Linux, macOS, BSDs); elsewhere (Windows) by path.
_FD_WALK = os.scandir in os.supports_fd and os.open in os.supports_dir_fd
# What open(2) says when O_NOFOLLOW met a link (Linux ELOOP, FreeBSD EMLINK, NetBSD EFTYPE).
_NOFOLLOW_ERRNOS = {errno.ELOOP, errno.EMLINK, getattr(errno, "EFTYPE", errno.ELOOP)}


def _file_id(st: os.stat_result) -> tuple[int, int, int, int]:
    """The fields that must not change while a file is read."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    """Same file: (device, inode)."""
    return a.st_ino == b.st_ino and a.st_dev == b.st_dev


def _replaced(shown: str) -> ArtifactError:
    """The entry at `shown` is no longer what the walk checked (a link, a FIFO, another file swapped in)."""
    return ArtifactError(f"replaced since it was checked (not the file the walk saw): {shown}")


def _hash_regular(
    real: str, shown: str, progress: Progress | None, walked: os.stat_result | None = None
) -> tuple[str, int]:
    """Stream one regular file; return (hex digest, size), refusing files that change.

    `real` is what is opened, `shown` is what error messages name (the user's path).
    `walked`: the stat the walk took of this entry (of a link's target: `real`). `real` is
    then opened without following a link in its last component, and the descriptor must be
    that file (device, inode) and regular, else the entry was swapped since it was checked
    (a link or a directory component leading elsewhere): an error naming it, never a hash
    of something else. Without `walked` (`hash_file`), `real` is stat'ed (links followed).
    """
    before = walked
    try:
        if walked is None:
            before = os.stat(real)
            if not stat.S_ISREG(before.st_mode):  # checked before open: never open a FIFO
                raise ArtifactError(f"not a regular file: {shown}")
            fd = os.open(real, _OPEN_FLAGS)
        else:
            fd = os.open(real, _ENTRY_FLAGS)
    except FileNotFoundError:
        raise ArtifactError(f"no such file or directory: {shown}") from None
    except OSError as exc:
        if walked is not None and exc.errno in _NOFOLLOW_ERRNOS | {errno.ENOTDIR}:
            raise _replaced(shown) from None
        raise ArtifactError(f"cannot read {shown}: {exc.strerror}") from exc
    digest = hashlib.sha256()
    read = 0
    try:
        try:  # the descriptor itself: a file object would stat it once more
            opened = os.fstat(fd)
            if walked is not None:
                # The inode the walk checked (inside the root), so no name swapped since led elsewhere.
                if not stat.S_ISREG(opened.st_mode) or not _same(opened, walked):
                    raise _replaced(shown)
            elif before is not None and _file_id(opened) != _file_id(before):  # nothing swapped in since the stat
                raise ArtifactError(f"file changed while hashing: {shown}")
            while chunk := os.read(fd, CHUNK_SIZE):
                digest.update(chunk)
                read += len(chunk)
                if progress is not None:
                    progress(len(chunk))
        finally:
            os.close(fd)
        after = os.stat(real)
    except FileNotFoundError:
        raise ArtifactError(f"file changed while hashing: {shown}") from None
    except OSError as exc:
        raise ArtifactError(f"cannot read {shown}: {exc.strerror}") from exc
    if read != opened.st_size or _file_id(after) != _file_id(opened):
        raise ArtifactError(f"file changed while hashing: {shown}")
    return digest.hexdigest(), read


def hash_file(path: StrPath, *, progress: Progress | None = None) -> str:
    """sha256 hex of one regular file's bytes, read in 1 MiB chunks."""
    return _hash_regular(os.fspath(path), os.fspath(path), progress)[0]


# Where a path leads: (real path, its stat, an O_PATH descriptor of it or None).
_Found = tuple[str, os.stat_result, int | None]


def _link_error(exc: OSError, shown: str) -> ArtifactError:
    if exc.errno == errno.ELOOP:
        return ArtifactError(f"symlink loop: {shown}")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ArtifactError(f"dangling symlink: {shown}")
    return ArtifactError(f"cannot resolve symlink {shown}: {exc.strerror}")


def _check_inside(target: str, allowed: str, shown: str) -> None:
    if not inside(target, allowed):
        raise ArtifactError(f"symlink leads outside the allowed root: {shown} -> {target}")


def _resolve_link(link: str, shown: str, allowed: str) -> str:
    """Realpath of the target of `link`; refused if dangling, looping or outside."""
    try:
        target = os.path.realpath(link, strict=True)
    except OSError as exc:
        raise _link_error(exc, shown) from (None if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR) else exc)
    _check_inside(target, allowed, shown)
    return target


def _follow(path: str, shown: str, allowed: str, name: str = "", dir_fd: int | None = None) -> _Found:
    """Where `path` (`name` in the directory open as `dir_fd`) leads, links followed; refused outside `allowed`.

    Returns (real path, its stat, an O_PATH descriptor of it or None). On Linux one O_PATH
    descriptor answers both where (/proc) and what (fstat), so the file checked against the
    root is the file stat'ed, whatever is renamed meanwhile; it is returned open (the caller
    closes it) to list a directory through. Elsewhere `os.path.realpath` and a stat by path.
    """
    try:
        handle = open_path(path if dir_fd is None else name, dir_fd)
    except OSError as exc:
        raise _link_error(exc, shown) from None
    if handle is not None:
        try:
            target = fd_path(handle)
            if target is not None:
                _check_inside(target, allowed, shown)
                return target, os.fstat(handle), handle
        except BaseException:
            os.close(handle)
            raise
        os.close(handle)
    target = _resolve_link(path, shown, allowed)
    return target, os.stat(target), None


def _open_dir(
    real: str, st: os.stat_result, shown: str, name: str = "", dir_fd: int | None = None, handle: int | None = None
) -> int | str:
    """What `_walk` lists directory `real` through: a descriptor of the directory the walk stat'ed as `st`.

    Opened as `name` in the checked directory `dir_fd`, or through the O_PATH `handle` a
    link resolved to, or (the top) as `real`, never following a link in the last
    component, and checked by (device, inode): a directory swapped since it was stat'ed is
    an error naming it. Where descriptors cannot be listed, the path itself.
    """
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
        if exc.errno in _NOFOLLOW_ERRNOS | {errno.ENOTDIR, errno.ENOENT}:
            raise ArtifactError(f"replaced since it was checked (not the directory the walk saw): {shown}") from None
        raise ArtifactError(f"cannot list {shown}: {exc.strerror}") from exc
    try:
        same = _same(os.fstat(fd), st)
    except OSError as exc:
        os.close(fd)
        raise ArtifactError(f"cannot list {shown}: {exc.strerror}") from exc
    if not same:
        os.close(fd)
        raise ArtifactError(f"replaced since it was checked (not the directory the walk saw): {shown}")
    return fd


# One collected file: (relative path bytes, real path to open, path for messages, its stat
# when collected: what a digest's re-use compares, so a cache hit stats each file once, and
# what the descriptor opened to read it must be).
_Entry = tuple[bytes, str, str, os.stat_result]


def _walk(
    where: int | str,
    real_dir: str,
    shown_dir: str,
    prefix: bytes,
    allowed: str,
    stack: set[str],
    out: list[_Entry],
) -> None:
    """Collect regular files under `real_dir`; `stack` = realpaths of open ancestors.

    `where` is what `_open_dir` gave: a descriptor of `real_dir` (its entries are stat'ed and
    opened relative to it, so a directory component swapped by name is never followed), or
    the path itself where the system cannot list a descriptor.
    """
    dir_fd = where if isinstance(where, int) else None
    try:
        with os.scandir(where) as it:
            entries = list(it)
    except OSError as exc:
        raise ArtifactError(f"cannot list {shown_dir}: {exc.strerror}") from exc
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
                raise ArtifactError(f"cannot stat {shown}: {exc.strerror}") from exc
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


def _collect(path: StrPath, root: StrPath | None) -> tuple[bool, list[_Entry]]:
    """Check `path` against the rules; return (is_directory, files in stream order)."""
    shown = os.fspath(path)
    if root is not None and path_escapes_root(shown, root):
        # Asked only here, so a sound root costs no stat: every path "escapes" a root that is not there.
        problem = folder_problem(root)
        raise ArtifactError(f"root {os.fspath(root)} {problem}" if problem else f"path escapes root: {shown}")
    try:
        own = os.lstat(shown)  # one call says: there, a link or not, and (not a link) what it is
    except OSError:
        raise ArtifactError(f"no such file or directory: {shown}") from None
    is_link = stat.S_ISLNK(own.st_mode)
    handle = None
    if root is None and not is_link:
        # The path is its own root: nothing outside it to guard against, so it is
        # resolved only if it is a directory to walk (saves ~20 us per trusted-state file).
        if stat.S_ISREG(own.st_mode):
            return False, [(b"", shown, shown, own)]
        real = allowed = real_path(shown)
        st = own
    else:
        allowed = real_path(os.fspath(root) if root is not None else shown)
        try:  # a link, or an intermediate directory that links out, is refused naming the path
            real, st, handle = _follow(shown, shown, allowed)
        except OSError as exc:
            raise ArtifactError(f"cannot stat {shown}: {exc.strerror}") from exc
    try:
        if stat.S_ISREG(st.st_mode):
            return False, [(b"", real, shown, st)]
        if not stat.S_ISDIR(st.st_mode):
            raise ArtifactError(f"special file (not regular or a directory): {shown}")
        out: list[_Entry] = []
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


@attrs.frozen
class TreeDigest:
    """A file's or directory's hash and, for a directory, what it was built from.

    `files` holds `(relative POSIX path, size, sha256)` in stream order, or None when
    the path is a single file or the directory has more than `MAX_LISTED_FILES` files.
    """

    sha256: str
    is_directory: bool
    count: int
    size: int
    files: tuple[tuple[str, int, str], ...] | None

    def to_json(self) -> dict[str, Any] | None:
        """What events record (None for a single file: its hash says everything)."""
        if not self.is_directory:
            return None
        files = None if self.files is None else [{"path": p, "size": n, "sha256": h} for p, n, h in self.files]
        return {"count": self.count, "size": self.size, "files": files}


def hash_tree(
    path: StrPath,
    root: StrPath | None = None,
    *,
    progress: Progress | None = None,
    max_listed: int = MAX_LISTED_FILES,
) -> TreeDigest:
    """`hash_directory` with the per-file listing it was computed from (see `TreeDigest`)."""
    is_dir, files = _collect(path, root)
    return _hash_collected(is_dir, files, progress, max_listed)


def _hash_collected(is_dir: bool, files: list[_Entry], progress: Progress | None, max_listed: int) -> TreeDigest:
    if not is_dir:
        _, real, shown, st = files[0]
        digest, size = _hash_regular(real, shown, progress, st)
        return TreeDigest(digest, False, 1, size, None)
    stream = hashlib.sha256(TREE_FORMAT.encode("ascii") + b"\n")
    listed: list[tuple[str, int, str]] = []
    total = 0
    for rel, real, shown, walked in files:
        hexdigest, size = _hash_regular(real, shown, progress, walked)
        line = b"%s\0%d\0%s\n" % (rel, size, hexdigest.encode("ascii"))
        stream.update(line)
        total += size
        if len(files) <= max_listed:
            # JSON cannot carry undecodable bytes: such a name is shown escaped (the hash used the bytes).
            listed.append((rel.decode("utf-8", "backslashreplace"), size, hexdigest))
    return TreeDigest(stream.hexdigest(), True, len(files), total, tuple(listed) if len(files) <= max_listed else None)


# Per file: (relative path, device, inode, size, mtime_ns, ctime_ns). A rewrite changes
# ctime even when size and mtime are put back (only the kernel sets ctime).
_Identity = tuple[tuple[bytes, int, int, int, int, int], ...]


def _identity(files: list[_Entry]) -> _Identity:
    """From the stats the walk took (before any byte is read: a change during the read shows next time)."""
    return tuple((rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for rel, _, _, st in files)


@attrs.define
class DigestCache:
    """Digests this process computed, re-used while every file's identity is unchanged.

    `hash_tree` walks the path with the same rules as the module's `hash_tree` (realpath,
    symlinks inside the root, no special files) and stats every file; when each file's
    (device, inode, size, mtime_ns, ctime_ns) equals what it was when its bytes were last
    read, the earlier digest is returned with the time of that read, without reading a
    byte. Anything else (a new, removed or touched file) reads every byte again.

    Residual risk (README "Artifact digests"): a change that keeps size, mtime *and*
    ctime, which only a privileged writer can make (setting the clock back, writing the
    block device), or a file system whose timestamps are coarser than the change
    interval, is not seen until a full read (`--rehash`, `audit`).

    At most `max_entries` digests are kept (each holds its folder's per-file listing), the
    least recently used evicted first: a long-lived Ledger stays flat. An evicted one is
    simply read again when next checked.
    """

    clock: Callable[[], str]
    max_entries: int = 2048
    _entries: OrderedDict[tuple[str, str | None], tuple[_Identity, TreeDigest, str]] = attrs.field(factory=OrderedDict)

    def hash_tree(self, path: StrPath, root: StrPath | None = None) -> tuple[TreeDigest, str | None]:
        """`(digest, reused_from)`: `reused_from` is when the bytes were read (None: read now)."""
        key = (os.path.abspath(path), None if root is None else os.path.abspath(root))
        is_dir, files = _collect(path, root)
        identity = _identity(files)  # taken before reading: a change during the read shows next time
        entries = self._entries
        cached = entries.get(key)
        if cached is not None and cached[0] == identity:
            entries.move_to_end(key)
            return cached[1], cached[2]
        hashed_at = self.clock()
        digest = _hash_collected(is_dir, files, None, MAX_LISTED_FILES)
        entries[key] = (identity, digest, hashed_at)
        entries.move_to_end(key)
        if len(entries) > self.max_entries:
            entries.popitem(last=False)
        return digest, None


def hash_directory(
    path: StrPath,
    root: StrPath | None = None,
    *,
    progress: Progress | None = None,
) -> str:
    """Content hash of a file or directory tree, as specified in the module docstring.

    `root` widens the area symlinks may point into (e.g. a Hugging Face cache repo
    whose snapshot links into ``../../blobs``); `path` must lie inside it.
    """
    return hash_tree(path, root, progress=progress, max_listed=0).sha256


def tree_size(path: StrPath, root: StrPath | None = None) -> int:
    """Total bytes `hash_directory` would read (for progress bars); same checks."""
    return sum(entry[3].st_size for entry in _collect(path, root)[1])
