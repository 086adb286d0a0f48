"""Recording trusted states off the training thread, and sharing one process's answer with every rank.

Hashing a checkpoint reads every byte of it (a 256 MiB checkpoint takes most of a
second); a training loop that waited for it would stall at each save. A
`TrustedStateRecorder` hands each record to a thread of its own, which opens its own
`Ledger` on the same location (a ledger and its store are used only by the thread that
opened them) and records in order. A record that fails is kept and raised by the next
`wait()`, never dropped: the training loop calls `wait()` at each boundary where a
record must be known (before the next save, on a failure, at the end). One whose path
was removed before it was made (a checkpoint rotated away) is skipped with a warning:
bytes never recorded are never trusted.

`on_main` runs a step on the main process of a `torch.distributed` group and hands its
result, or its failure, to every rank, so all ranks go on (or stop) together.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.results import CandidateResult

__all__ = ["MainProcessError", "PendingRecord", "TrustedStateRecorder", "barrier", "is_distributed", "on_main"]

T = TypeVar("T")
log = get_logger(__name__)


class MainProcessError(RuntimeError):
    """Raised on every other rank when a step the main process ran for the group failed there."""


@attrs.frozen
class PendingRecord:
    """One trusted state to record: `record_trusted_state(candidate_id, kind, path, event_id=event_id)`."""

    candidate_id: str
    kind: str
    path: str
    event_id: str


class TrustedStateRecorder:
    """Records trusted states in order on a thread of its own; `wait()` raises the first that failed."""

    def __init__(self, location: str | os.PathLike[str], *, actor: str, artifact_root: str | None) -> None:
        self._location, self._actor, self._artifact_root = location, actor, artifact_root
        self._queue: queue.Queue[PendingRecord | None] = queue.Queue()
        self._failures: list[tuple[PendingRecord, BaseException]] = []
        self._thread: threading.Thread | None = None
        self.recorded: list[CandidateResult] = []  # what the thread recorded, in order
        self.skipped: list[PendingRecord] = []  # records whose path was removed before they were made

    def submit(self, record: PendingRecord) -> None:
        """Queue a record; returns at once (the thread starts with the first one)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lifecycle-trusted-states", daemon=True)
            self._thread.start()
        self._queue.put(record)

    def wait(self) -> None:
        """Block until every queued record is recorded; raise the first failure (once)."""
        self._queue.join()
        if self._failures:
            record, error = self._failures[0]
            self._failures.clear()
            error.add_note(f"while recording {record.kind} {record.path} under event id {record.event_id!r}")
            raise error

    def close(self) -> None:
        """Record what is queued, stop the thread, then raise any failure left."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self.wait()

    def _run(self) -> None:
        try:
            ledger: Ledger | Exception = Ledger.open(
                self._location, actor=self._actor, artifact_root=self._artifact_root
            )
        except Exception as e:  # every record then fails with it: raised by the next wait()
            ledger = e
        try:
            while (record := self._queue.get()) is not None:
                try:
                    if isinstance(ledger, Exception):
                        raise ledger
                    self.recorded.append(
                        ledger.record_trusted_state(
                            record.candidate_id, record.kind, record.path, event_id=record.event_id
                        )
                    )
                except Exception as e:
                    if isinstance(ledger, Ledger) and not os.path.lexists(record.path):
                        # Removed before it was recorded (a Trainer rotating checkpoints): never trusted,
                        # so never resumed from; training is not failed for it.
                        self.skipped.append(record)
                        log.warning("trusted_state_gone", path=record.path, event_id=record.event_id, error=repr(e))
                    else:
                        self._failures.append((record, e))
                finally:
                    self._queue.task_done()
            self._queue.task_done()  # the stop marker
        finally:
            if isinstance(ledger, Ledger):
                ledger.close()


def is_distributed() -> bool:
    """Whether this process is one rank of an initialised `torch.distributed` group."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized())


def barrier() -> None:
    """Wait until every rank got here (nothing to wait for in a single process)."""
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()


def on_main(is_main: bool, step: Callable[[], T]) -> T:
    """Run `step` on the main process and give every rank its result (each rank must call this).

    A failure on the main process is raised there as itself and on every other rank as a
    `MainProcessError` naming it, so no rank is left waiting in a collective.
    """
    if not is_distributed():
        return step()
    import torch.distributed as dist

    outcome: list[Any] = [None]
    error: BaseException | None = None
    if is_main:
        try:
            outcome[0] = ("ok", step())
        except BaseException as e:
            error = e
            outcome[0] = ("error", f"{type(e).__name__}: {e}")
    dist.broadcast_object_list(outcome, src=0)
    if error is not None:
        raise error
    status, value = outcome[0]
    if status == "error":
        raise MainProcessError(f"the main process failed: {value}")
    return value  # type: ignore[no-any-return]
