"""Files a command writes: in place whole or not at all, and a full disk said as what it is.

Every output (signed heads, attestations, key pairs, audit records, reports, manifests,
the decision pool) is written the same way: a temporary file in the target's folder,
written and fsynced, then renamed over (or, when a file must never be overwritten,
hard-linked to) the target, and the folder fsynced so the rename itself survives a crash.
A reader sees the old file or the whole new one; a failure leaves neither a partial nor
a 0-byte file to block the next try.

`stage` writes the temporary file only, so a command that appends an event for its
output (`seal --out`) can do so once the bytes are safely on disk, and put the file in
place afterwards: on a full disk the event is never appended for a file that is not there.

A full, read-only or over-quota filesystem is the environment's fault, not the input's:
`StoreError` (exit 7). Anything else (a permission, a missing folder) is an `InputError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

import attrs

from lifecycle_fsm.errors import InputError, LifecycleError, StoreError

__all__ = ["ENVIRONMENT_ERRNOS", "StagedFile", "fsync_folder", "output_error", "stage", "write_atomic"]

# The filesystem cannot take the bytes (full, over quota, read-only, too large, failing): exit 7.
ENVIRONMENT_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG", "EIO") if hasattr(errno, name)
)


def output_error(path: str | os.PathLike[str], error: OSError, what: str = "nothing was written") -> LifecycleError:
    """The one-line error for an output that could not be written: StoreError for the environment, else InputError."""
    why = error.strerror or str(error)
    if error.errno in ENVIRONMENT_ERRNOS:
        return StoreError(f"cannot write {os.fspath(path)}: {why} ({what}; free space or fix the filesystem, retry)")
    return InputError(f"cannot write {os.fspath(path)}: {why} ({what})")


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Make a rename in `folder` durable (POSIX; a no-op where folders cannot be opened or synced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
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
        except OSError as e:
            self.discard()
            raise output_error(self.target, e) from None
        except BaseException:
            self.discard()
            raise
        fsync_folder(self.target.parent)

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
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # mkstemp makes 0600: an output is meant to be read unless `mode` says not
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(e, OSError):
            raise output_error(path, e, what) from None
        raise
    return StagedFile(path, temporary)


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
