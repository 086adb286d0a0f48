"""Re-using an artifact's digest while every file's (device, inode, size, mtime_ns, ctime_ns) is what it
was when its bytes were read, so a supervisor re-checking candidates does not re-read the same
gigabytes; the check records when they were read (`reused_from`)."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable

import attrs

from lifecycle_fsm.artifact_walk import StrPath, collect
from lifecycle_fsm.artifacts import MAX_LISTED_FILES, TreeDigest, hash_collected

__all__ = ["DigestCache"]


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
