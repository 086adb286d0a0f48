"""Files a command writes: in place whole or not at all, and a full disk said as what it is.

Every output is a temporary file in the target's folder, fsynced, then renamed over (or hard-linked
to, when never overwritten) the target, and the folder fsynced. `stage` writes the temporary file
only, so a command can append the event for its output once the bytes are on disk. A full,
read-only or over-quota filesystem is `StoreError` (exit 7); anything else an `InputError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

import attrs

from lifecycle_fsm.errors import InputError, LifecycleError, StoreError

# The filesystem cannot take the bytes (full, over quota, read-only, too large, failing): exit 7.
_ENVIRONMENT_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG", "EIO") if hasattr(errno, name)
)


def output_error(path: str | os.PathLike[str], error: OSError, what: str = "nothing was written") -> LifecycleError:
    """The one-line error for an output that could not be written: StoreError for the environment, else InputError."""
    why = error.strerror or str(error)
    if error.errno in _ENVIRONMENT_ERRNOS:
        return StoreError(f"cannot write {os.fspath(path)}: {why} ({what}; free space or fix the filesystem, retry)")
    return InputError(f"cannot write {os.fspath(path)}: {why} ({what})")


def _fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Make a rename in `folder` durable (POSIX; a no-op where folders cannot be opened or synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@attrs.frozen
class StagedFile:
    """A file written in full and fsynced beside its target, not yet in place: `commit` or `discard` it."""

    target: Path
    temporary: str

    def commit(self, *, exclusive: bool = False) -> None:
        """Put the file in place: renamed over the target, or (`exclusive`) linked only where none exists."""
        try:
            if exclusive:
                try:
                    os.link(self.temporary, self.target)  # atomic and never overwrites: EEXIST if the name is taken
                except FileExistsError:
                    raise InputError(f"{self.target} already exists: it is never overwritten") from None
                os.unlink(self.temporary)
            else:
                os.replace(self.temporary, self.target)
        except BaseException as e:
            self.discard()
            if isinstance(e, OSError):
                raise output_error(self.target, e) from None
            raise
        _fsync_folder(self.target.parent)

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.temporary)


def stage(
    target: str | os.PathLike[str], data: bytes, *, mode: int = 0o644, what: str = "nothing was written"
) -> StagedFile:
    """Write `data` to a temporary file (`mode`) in `target`'s folder and fsync it; on failure nothing is left."""
    path = Path(target)
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise output_error(path, e, what) from None
    staged = StagedFile(path, temporary)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # mkstemp makes 0600: an output is meant to be read unless `mode` says not
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException as e:
        staged.discard()
        if isinstance(e, OSError):
            raise output_error(path, e, what) from None
        raise
    return staged


def write_atomic(
    target: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o644,
    exclusive: bool = False,
    what: str = "nothing was written",
) -> Path:
    """`stage` then `commit`: the target holds all of `data`, or is as it was."""
    staged = stage(target, data, mode=mode, what=what)
    staged.commit(exclusive=exclusive)
    return staged.target
