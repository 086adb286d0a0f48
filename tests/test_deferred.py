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
from lifecycle_fsm.events import EVENT_TYPES, CandidateEvent, CandidateReceived, Event, TrustedStateRecorded
from lifecycle_fsm.snapshots import SnapshotProblem
from lifecycle_fsm.state import CandidateState, LedgerSettings

DEFERRED_MODULES = ("lifecycle_fsm.event_base", "lifecycle_fsm.candidate_events", "lifecycle_fsm.events",
                    "lifecycle_fsm.state", "lifecycle_fsm.snapshots")  # fmt: skip


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_importing_the_domain_builds_no_class_and_imports_no_attrs() -> None:
    """The event, state and snapshot modules declare ~20 classes; none is built, attrs is not imported."""
    out = run(
        "import sys, importlib\n"
        f"for m in {DEFERRED_MODULES!r}: importlib.import_module(m)\n"
        "from lifecycle_fsm import deferred\n"
        "assert 'attr' not in sys.modules and 'attrs' not in sys.modules, 'attrs imported'\n"
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
    @frozen
    class Raced:
        x: int

    made: list[Any] = []
    threads = [threading.Thread(target=lambda: made.append(Raced(1))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [Raced(1)] * 8 and len(attrs.fields(Raced)) == 1


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
