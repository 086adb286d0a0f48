"""The error tree (`lifecycle_fsm/errors.py`): builtin bases, fields, pickling, no exit codes."""

from __future__ import annotations

import copy
import importlib
import pickle
import pkgutil

import pytest
from conftest import REPO

from lifecycle_fsm import errors
from lifecycle_fsm.decision_pool import DecisionPoolError
from lifecycle_fsm.errors import (
    ArtifactError,
    ArtifactUnreadable,
    ConcurrencyError,
    ConflictError,
    CorruptionError,
    DuplicateEventError,
    IllegalCommandError,
    InputError,
    IntegrityError,
    LedgerClosedError,
    LifecycleError,
    NotFoundError,
    ScenarioError,
    StoreError,
)
from lifecycle_fsm.feed import WaitTimeout
from lifecycle_fsm.state import IllegalTransition

# One instance of every error class, with its structured fields (other test modules use it too).
ERROR_EXAMPLES: dict[type[LifecycleError], LifecycleError] = {
    LifecycleError: LifecycleError("something the library refused"),
    InputError: InputError("no such manifest: m.json"),
    ArtifactError: ArtifactError("adapter: a symlink leads outside the root"),
    ArtifactUnreadable: ArtifactUnreadable("cannot read adapter: Permission denied"),
    ScenarioError: ScenarioError("s.yaml: step 2: key 'candidate': required"),
    NotFoundError: NotFoundError("unknown candidate: 'nope'", candidate_id="nope"),
    ConflictError: ConflictError("no active baseline"),
    IllegalCommandError: IllegalCommandError("reject allows nothing", state="reject", trigger="check"),
    ConcurrencyError: ConcurrencyError("lost a race", stream_id="dpo-v5", expected_version=3, actual_version=4),
    DuplicateEventError: DuplicateEventError("event_id reused", event_id="e-1", seq=7),
    IntegrityError: IntegrityError("chain broken at seq 5", seq=5, expected="ab", actual="cd"),
    CorruptionError: CorruptionError("seq 9: reject -> ready", seq=9, found="HandoffDecided"),
    IllegalTransition: IllegalTransition(seq=9, stream_id="dpo-x", state="reject", trigger="hand_off", type_name="X"),
    StoreError: StoreError("ledger.db: database is locked"),
    LedgerClosedError: LedgerClosedError("this Ledger was closed"),
    DecisionPoolError: DecisionPoolError("pool/0001.json: key 'schema': required"),
    WaitTimeout: WaitTimeout("dpo-x: not ready after 5 s", candidate_id="dpo-x", states=("ready",), last_state="tune"),
}


def _all_error_classes() -> set[type[LifecycleError]]:
    """Every LifecycleError subclass defined anywhere in the three packages (modules imported first)."""
    for package in ("lifecycle_fsm", "store", "replay"):
        for info in pkgutil.walk_packages([str(REPO / package.replace(".", "/"))], prefix=f"{package}."):
            if not info.name.endswith("__main__"):  # importing it would run the CLI
                importlib.import_module(info.name)
    found: set[type[LifecycleError]] = set()
    todo: list[type[LifecycleError]] = [LifecycleError]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] in ("lifecycle_fsm", "store", "replay"):
            found.add(cls)
        todo += cls.__subclasses__()
    return found


def test_examples_cover_every_error_class() -> None:
    """A new error class must get an example here, so the exit-code and pickling tests see it."""
    assert _all_error_classes() == set(ERROR_EXAMPLES)
    assert {getattr(errors, n) for n in errors.__all__} <= set(ERROR_EXAMPLES)


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [(InputError, ValueError), (NotFoundError, LookupError), (ConflictError, RuntimeError), (StoreError, OSError)],
)
def test_each_branch_is_also_its_builtin(cls: type[LifecycleError], builtin: type[Exception]) -> None:
    """Callers who know only the standard library can catch a branch (and its leaves) by its builtin."""
    assert issubclass(cls, LifecycleError) and issubclass(cls, builtin)
    leaves = [c for c in ERROR_EXAMPLES if issubclass(c, cls)]
    assert all(issubclass(c, builtin) for c in leaves)


def test_integrity_errors_have_no_builtin_base() -> None:
    """Corruption is caught as itself: the fold's `except ValueError` around payload parsing must not see it."""
    for cls in (IntegrityError, CorruptionError, IllegalTransition):
        assert not issubclass(cls, ValueError | LookupError | RuntimeError | OSError)


@pytest.mark.parametrize("cls", list(ERROR_EXAMPLES), ids=lambda c: c.__name__)
def test_errors_know_nothing_of_exit_codes(cls: type[LifecycleError]) -> None:
    """The CLI maps classes to codes; an error class carries no `exit_code`."""
    assert not hasattr(cls, "exit_code")


@pytest.mark.parametrize("cls", list(ERROR_EXAMPLES), ids=lambda c: c.__name__)
def test_errors_survive_pickling_and_copying(cls: type[LifecycleError]) -> None:
    """Type, message, args and structured fields come back (an error raised in a worker process reaches its parent)."""
    error = ERROR_EXAMPLES[cls]
    for again in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error)):
        assert type(again) is cls
        assert (str(again), again.args, vars(again)) == (str(error), error.args, vars(error))


def test_store_error_is_an_oserror_that_keeps_its_message() -> None:
    """StoreError is caught as OSError, prints its message (not "[Errno …]") and takes exactly one argument."""
    error = StoreError("ledger.db: not a usable ledger database")
    assert str(error) == "ledger.db: not a usable ledger database"
    assert (error.errno, error.strerror, error.filename) == (None, None, None)
    with pytest.raises(OSError, match="not a usable ledger"):
        raise error
    with pytest.raises(TypeError):
        StoreError(2, "ENOENT")  # type: ignore[call-arg]


def test_structured_fields() -> None:
    """Leaves keep what a machine needs: versions, ids, seqs, the refused move."""
    race = ERROR_EXAMPLES[ConcurrencyError]
    assert isinstance(race, ConcurrencyError)
    assert (race.stream_id, race.expected_version, race.actual_version) == ("dpo-v5", 3, 4)
    corrupt = ERROR_EXAMPLES[CorruptionError]
    assert isinstance(corrupt, CorruptionError)
    assert (corrupt.seq, corrupt.details) == (9, {"found": "HandoffDecided"})
