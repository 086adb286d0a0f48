"""`lifecycle_fsm.deferred`: attrs classes decorated on first use, in place, with attrs' own semantics.

Laziness is checked in fresh interpreters (this one has built every class long ago); the
semantics (fields, frozenness, equality, pickling, inheritance) in both.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
from typing import Any, ClassVar

import attrs
import pytest

from lifecycle_fsm import deferred
from lifecycle_fsm.deferred import Factory, field_names, frozen
from lifecycle_fsm.events import (
    EVENT_TYPES,
    CandidateEvent,
    CandidateReceived,
    Event,
    StageFailed,
    TrustedStateRecorded,
)
from lifecycle_fsm.snapshots import SnapshotProblem
from lifecycle_fsm.state import CandidateState, LedgerSettings

DEFERRED_MODULES = ("lifecycle_fsm.event_base", "lifecycle_fsm.candidate_events", "lifecycle_fsm.events",
                    "lifecycle_fsm.state", "lifecycle_fsm.snapshots")  # fmt: skip


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_importing_the_domain_builds_no_class() -> None:
    """The event, state and snapshot modules declare ~20 classes; none is built (attrs itself is
    imported: the store's records are attrs classes)."""
    out = run(
        "import sys, importlib\n"
        f"for m in {DEFERRED_MODULES!r}: importlib.import_module(m)\n"
        "from lifecycle_fsm import deferred\n"
        "print(sorted(c.__name__ for c in deferred._PENDING))\n"
    )
    pending = set(eval(out))
    assert set(EVENT_TYPES) | {"Event", "CandidateEvent", "LedgerEvent", "CandidateState", "LedgerSettings",
                               "SnapshotProblem"} == pending  # fmt: skip


def test_an_instance_builds_its_class_and_bases_only() -> None:
    """Creating one event builds it and its bases (attrs is imported then); its siblings stay deferred."""
    out = run(
        "import sys\n"
        "from lifecycle_fsm.deferred import is_deferred\n"
        "from lifecycle_fsm.events import StageFailed, CandidateEvent, Event, RecoveryCompleted, LedgerInitialized\n"
        "e = StageFailed(stage='reward')\n"
        "assert 'attrs' in sys.modules\n"
        "print([is_deferred(c) for c in (StageFailed, CandidateEvent, Event, RecoveryCompleted, LedgerInitialized)])\n"
    )
    assert out.strip() == "[False, False, False, True, True]"


def test_attrs_api_on_a_deferred_class_builds_it() -> None:
    """`attrs.fields` / `attrs.has` on a class nobody instantiated yet answer as for a built class."""
    out = run(
        "import attrs\n"
        "from lifecycle_fsm.deferred import is_deferred\n"
        "from lifecycle_fsm.events import WindowAdvanced, EvaluationActivated\n"
        "assert is_deferred(WindowAdvanced) and is_deferred(EvaluationActivated)\n"
        "print([a.name for a in attrs.fields(WindowAdvanced)], attrs.has(EvaluationActivated))\n"
        "assert not is_deferred(WindowAdvanced) and not is_deferred(EvaluationActivated)\n"
    )
    assert out.strip() == "['active_window', 'previous_window'] True"


def test_field_names_before_the_build_are_attrs_fields_after_it() -> None:
    """`field_names` of every deferred class, read before it is built, equals `attrs.fields` once built."""
    out = run(
        "import importlib, attrs\n"
        f"for m in {DEFERRED_MODULES!r}: importlib.import_module(m)\n"
        "from lifecycle_fsm import deferred\n"
        "classes = sorted(deferred._PENDING, key=lambda c: c.__name__)\n"
        "assert all(c in deferred._PENDING for c in classes)\n"
        "before = {c: deferred.field_names(c) for c in classes}\n"
        "for c in classes:  # bases are built along with their subclasses: field_names holds either way\n"
        "    assert tuple(a.name for a in attrs.fields(c)) == before[c] == deferred.field_names(c), c\n"
        "print(len(classes))\n"
    )
    assert int(out) >= 20


class _Plain:
    pass


@frozen
class _Base:
    KIND: ClassVar[str] = "base"
    a: int
    b: str = "b"


@frozen
class _Child(_Base):
    KIND: ClassVar[str] = "child"
    c: dict[str, int] = Factory(dict)

    def total(self) -> int:
        return self.a + len(self.c)


@frozen
class _Redefines(_Base):
    a: int = 1  # a base field given a default: attrs puts it last


def test_a_deferred_class_behaves_as_attrs_frozen() -> None:
    assert deferred.is_deferred(_Child)
    assert field_names(_Child) == ("a", "b", "c")
    assert field_names(_Redefines) == ("b", "a")
    one, two = _Child(1), _Child(1)
    assert not deferred.is_deferred(_Child) and not deferred.is_deferred(_Base)
    assert one == two and one != _Child(2) and hash(_Base(1)) == hash(_Base(1))
    assert one.c == {} and one.c is not two.c  # Factory: a fresh dict each
    assert repr(one) == "_Child(a=1, b='b', c={})"
    assert isinstance(one, _Base) and one.total() == 1 and _Child.KIND == "child"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        one.a = 2  # type: ignore[misc]
    assert attrs.evolve(one, a=5) == _Child(5)
    assert attrs.asdict(one) == {"a": 1, "b": "b", "c": {}}
    assert pickle.loads(pickle.dumps(one)) == one
    assert [a.name for a in attrs.fields(_Redefines)] == ["b", "a"]
    assert _Redefines() == _Redefines(a=1)
    with pytest.raises(TypeError):
        _Child()  # type: ignore[call-arg]


def test_a_subclass_built_after_its_base_has_its_own_fields() -> None:
    """Once `_Base` is built, a still-deferred subclass must not answer with the base's fields or `__init__`."""

    @frozen
    class Late(_Base):
        d: int = 0

    _Base(1)
    assert not deferred.is_deferred(_Base) and deferred.is_deferred(Late)
    assert field_names(Late) == ("a", "b", "d")
    assert [a.name for a in attrs.fields(Late)] == ["a", "b", "d"]
    assert Late(1, "x", 4).d == 4


def test_a_class_that_writes_its_own_init_keeps_it() -> None:
    """attrs leaves a hand-written `__init__` alone (auto_detect); deferring must not lose it."""

    @frozen
    class Own:
        x: int

        def __init__(self, text: str) -> None:
            self.__attrs_init__(int(text))  # type: ignore[attr-defined]

    @frozen(init=False)
    class Manual:
        y: int

        def __init__(self) -> None:
            object.__setattr__(self, "y", 7)

    assert Own("3").x == 3 and Own("3") == Own("3")
    assert Manual().y == 7


def test_threads_build_a_class_once() -> None:
    """Eight threads released together construct a new class's first instances: none may meet the class
    half-built (before the fix, ~80% of constructions failed with "takes no arguments" here)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows: open every window
    failures: list[str] = []
    try:
        for _ in range(40):

            @frozen
            class Raced:
                x: int
                y: str = "a"

            made: list[Any] = []
            start = threading.Barrier(8)

            def construct(cls: type = Raced, start: threading.Barrier = start, made: list[Any] = made) -> None:
                start.wait()
                try:
                    made.append(cls(1, "b"))
                    made.append(attrs.fields(cls).x.name)
                except Exception as e:
                    failures.append(f"{type(e).__name__}: {e}")

            threads = [threading.Thread(target=construct) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(interval)
    assert failures == []


def test_an_instance_unpickled_before_its_class_is_built_is_an_attrs_instance() -> None:
    """Unpickling calls no `__init__`: the stand-in `__setstate__` builds the class first, so equality,
    hashing and frozenness are attrs' (a result sent back from a worker process, say)."""
    data = pickle.dumps((StageFailed(stage="reward"), LedgerSettings(initialized=True)))
    out = run(
        "import pickle, sys, copy\n"
        "from lifecycle_fsm.deferred import is_deferred\n"
        "from lifecycle_fsm.events import StageFailed\n"
        "from lifecycle_fsm.state import LedgerSettings\n"
        "assert is_deferred(StageFailed) and is_deferred(LedgerSettings)\n"
        f"e, s = pickle.loads({data!r})\n"
        "import attrs\n"
        "try:\n"
        "    e.stage = 'mutated'\n"
        "except attrs.exceptions.FrozenInstanceError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('an unpickled event could be mutated')\n"
        "print(e == StageFailed(stage='reward'), s == LedgerSettings(initialized=True),\n"
        "      len({s, pickle.loads(pickle.dumps(s))}), copy.deepcopy(e) == e, repr(e).startswith('StageFailed('))\n"
    )
    assert out.split() == ["True", "True", "1", "True", "True"]


def test_a_plain_subclass_runs_its_own_init_once() -> None:
    """A subclass (not deferred) whose `__init__` calls the deferred base's through `super()`: the base's
    stand-in builds the class and runs the base's attrs `__init__`, not the subclass's again."""

    @frozen
    class Base:
        x: int

    calls: list[int] = []

    class Tagged(Base):
        def __init__(self, x: int) -> None:
            calls.append(x)
            super().__init__(x)

    assert Tagged(1).x == 1 and Tagged(2).x == 2
    assert calls == [1, 2]


def test_a_child_forked_while_another_thread_builds_can_build() -> None:
    """A thread of the parent holds the build lock when the process forks: the child gets a fresh lock
    (`os.register_at_fork`) instead of one nobody will ever release."""
    out = run(
        "import os, threading, time, signal\n"
        "from lifecycle_fsm import deferred\n"
        "from lifecycle_fsm.events import StageFailed\n"
        "held = threading.Event()\n"
        "def hold():\n"
        "    with deferred._LOCK:\n"
        "        held.set(); time.sleep(2)\n"
        "threading.Thread(target=hold, daemon=True).start(); held.wait()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(5)\n"
        "    StageFailed(stage='x')\n"
        "    os._exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)\n"
    )
    assert out.strip() == "True"


def test_a_class_attrs_refuses_stays_deferred_and_refuses_every_time() -> None:
    """A mandatory field after a defaulted one: attrs' ValueError at the first use and at every later one
    (the class is left as it was, not half-built)."""

    @frozen
    class Bad:
        a: int = 0
        b: int  # type: ignore[misc]

    for _ in range(2):
        with pytest.raises(ValueError, match="No mandatory attributes allowed after an attribute with a default"):
            Bad(1, 2)
        assert deferred.is_deferred(Bad)


def test_build_of_a_plain_class_is_a_no_op() -> None:
    deferred.build(_Plain)
    assert not attrs.has(_Plain)


@pytest.mark.parametrize("cls", [Event, CandidateEvent, CandidateReceived, TrustedStateRecorded, CandidateState,
                                 LedgerSettings, SnapshotProblem])  # fmt: skip
def test_the_domain_classes_are_attrs_classes(cls: type) -> None:
    """Built or not yet, they answer attrs' API as frozen attrs classes (without slots: built in place)."""
    assert attrs.has(cls)
    assert tuple(a.name for a in attrs.fields(cls)) == field_names(cls)
    assert not deferred.is_deferred(cls)
