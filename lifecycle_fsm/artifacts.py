"""Deterministic content hashes for model artifacts (a file or a directory tree).

The hash is a product contract another tool must be able to recompute (docs/internals.md,
"Artifact hashing"). All digests are SHA-256, bare lowercase hex, over the exact bytes on
disk. A regular file hashes to ``sha256(file bytes)``; a directory to ``sha256(stream)``::

    b"lifecycle-fsm/tree-v1\\n"
    then, for every regular file under it, sorted by RELPATH (as bytes):
        RELPATH + b"\\0" + SIZE + b"\\0" + HEX + b"\\n"

``RELPATH`` is ``/``-separated and ``os.fsencode``d (undecodable names keep their raw
bytes), ``SIZE`` decimal ASCII, ``HEX`` the file's own sha256. Empty directories add nothing.
A symlink into the allowed root hashes as its target (`artifact_walk`). The bytes hashed are those of
the entry the walk checked, so an entry swapped or changed while read is an `ArtifactError`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections import OrderedDict
from collections.abc import Callable

import attrs

from lifecycle_fsm.artifact_walk import NOFOLLOW_ERRNOS, Entry, StrPath, collect, os_error, path_escapes_root, same_file
from lifecycle_fsm.errors import ArtifactError
from lifecycle_fsm.json_types import JSON

__all__ = [
    "MAX_LISTED_FILES",
    "DigestCache",
    "TREE_FORMAT",
    "TreeDigest",
    "hash_directory",
    "hash_tree",
    "path_escapes_root",
    "tree_size",
]

TREE_FORMAT = "lifecycle-fsm/tree-v1"
_CHUNK_SIZE = 1024 * 1024
# Above this many files a directory's listing is not kept, only its hash and count.
MAX_LISTED_FILES = 1000

Progress = Callable[[int], None]
# The walk keeps no path ending in a link, so a link there now was put there since the check.
# O_NONBLOCK: a FIFO swapped in does not hang.
_ENTRY_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)


def _file_id(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _replaced(shown: str) -> ArtifactError:
    return ArtifactError(f"replaced since it was checked (not the file the walk saw): {shown}")


def _hash_regular(real: str, shown: str, progress: Progress | None, walked: os.stat_result) -> tuple[str, int]:
    """Stream the regular file the walk stat'ed as `walked` (`shown` in errors); return (hex digest, size),
    refusing a file swapped since the walk or changed while read."""
    try:
        fd = os.open(real, _ENTRY_FLAGS)
    except FileNotFoundError:
        raise ArtifactError(f"no such file or directory: {shown}") from None
    except OSError as exc:
        if exc.errno in NOFOLLOW_ERRNOS | {errno.ENOTDIR}:
            raise _replaced(shown) from None
        raise os_error("read", shown, exc) from exc
    digest = hashlib.sha256()
    read = 0
    try:
        try:  # the descriptor itself: a file object would stat it once more
            opened = os.fstat(fd)
            # The inode the walk checked (inside the root), so no name swapped since led elsewhere.
            if not stat.S_ISREG(opened.st_mode) or not same_file(opened, walked):
                raise _replaced(shown)
            while chunk := os.read(fd, _CHUNK_SIZE):
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
        raise os_error("read", shown, exc) from exc
    if read != opened.st_size or _file_id(after) != _file_id(opened):
        raise ArtifactError(f"file changed while hashing: {shown}")
    return digest.hexdigest(), read


@attrs.frozen
class TreeDigest:
    """A file's or directory's hash and, for a directory, what it was built from: `files` holds
    `(relative POSIX path, size, sha256)` in stream order (None for a file, or over `MAX_LISTED_FILES`)."""

    sha256: str
    is_directory: bool
    count: int
    size: int
    files: tuple[tuple[str, int, str], ...] | None

    @property
    def algorithm(self) -> str:
        """How `sha256` was computed: the plain sha256 of a file, or this module's tree format."""
        return TREE_FORMAT if self.is_directory else "sha256"

    def to_json(self) -> JSON | None:
        """What events record (None for a single file: its hash says everything)."""
        if not self.is_directory:
            return None
        files = None if self.files is None else [{"path": p, "size": n, "sha256": h} for p, n, h in self.files]
        return {"count": self.count, "size": self.size, "files": files}


def hash_tree(
    path: StrPath, root: StrPath | None = None, *, progress: Progress | None = None, max_listed: int = MAX_LISTED_FILES
) -> TreeDigest:
    """`hash_directory` with the per-file listing it was computed from (see `TreeDigest`)."""
    is_dir, files = collect(path, root)
    return hash_collected(is_dir, files, progress, max_listed)


def hash_collected(is_dir: bool, files: list[Entry], progress: Progress | None, max_listed: int) -> TreeDigest:
    if not is_dir:
        _, real, shown, st = files[0]
        digest, size = _hash_regular(real, shown, progress, st)
        return TreeDigest(digest, False, 1, size, None)
    stream = hashlib.sha256(TREE_FORMAT.encode("ascii") + b"\n")
    listed: list[tuple[str, int, str]] = []
    total = 0
    for rel, real, shown, walked in files:
        hexdigest, size = _hash_regular(real, shown, progress, walked)
        stream.update(b"%s\0%d\0%s\n" % (rel, size, hexdigest.encode("ascii")))
        total += size
        if len(files) <= max_listed:
            # JSON cannot carry undecodable bytes: such a name is shown escaped (the hash used the bytes).
            listed.append((rel.decode("utf-8", "backslashreplace"), size, hexdigest))
    return TreeDigest(stream.hexdigest(), True, len(files), total, tuple(listed) if len(files) <= max_listed else None)


def hash_directory(path: StrPath, root: StrPath | None = None, *, progress: Progress | None = None) -> str:
    """Content hash of a file or directory tree (module docstring). `root` widens the area symlinks may
    point into (a Hugging Face snapshot linking into ``../../blobs``); `path` must lie inside it."""
    return hash_tree(path, root, progress=progress, max_listed=0).sha256


def tree_size(path: StrPath, root: StrPath | None = None) -> int:
    """Total bytes `hash_directory` would read (for progress bars); same checks."""
    return sum(entry[3].st_size for entry in collect(path, root)[1])


# Per file: (relative path, device, inode, size, mtime_ns, ctime_ns). A rewrite changes
# ctime even when size and mtime are put back (only the kernel sets ctime).
_Identity = tuple[tuple[bytes, int, int, int, int, int], ...]


@attrs.define
class DigestCache:
    """Digests this process computed, at most `max_entries` (least recently used evicted first). A change
    that keeps size, mtime *and* ctime is not seen until a full read (docs/embedding.md)."""

    clock: Callable[[], str]
    max_entries: int = 2048
    _entries: OrderedDict[tuple[str, str | None], tuple[_Identity, TreeDigest, str]] = attrs.field(factory=OrderedDict)

    def hash_tree(self, path: StrPath, root: StrPath | None = None) -> tuple[TreeDigest, str | None]:
        """`(digest, reused_from)`: `reused_from` is when the bytes were read (None: read now)."""
        key = (os.path.abspath(path), None if root is None else os.path.abspath(root))
        is_dir, files = collect(path, root)
        # From the stats the walk took, before any byte is read: a change during the read shows next time.
        identity = tuple(
            (rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for rel, _, _, st in files
        )
        entries = self._entries
        cached = entries.get(key)
        if cached is not None and cached[0] == identity:
            entries.move_to_end(key)
            return cached[1], cached[2]
        hashed_at = self.clock()
        digest = hash_collected(is_dir, files, None, MAX_LISTED_FILES)
        entries[key] = (identity, digest, hashed_at)
        entries.move_to_end(key)
        if len(entries) > self.max_entries:
            entries.popitem(last=False)
        return digest, None
