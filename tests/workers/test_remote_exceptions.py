"""Every exception a task raises is catchable in the driver as its own type (issue 21 item 2).

Real workers of a real embedded agent raise each kind; ``get`` must raise an instance of the
original class that keeps its fields, whatever the class's ``__init__``/``__new__`` takes,
whether it has slots, an attribute that cannot be pickled, or was defined where the test
runs (as a notebook defines it). A class the driver cannot import comes back as its
nearest base the driver has, its real name kept.
"""

from __future__ import annotations

import builtins
import errno
import json
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import jupyter_runtimeenv as jre
from jupyter_runtimeenv.errors import RemoteTaskError
from jupyter_runtimeenv.workers.executor import LocalExecutor


class KeywordOnly(Exception):
    def __init__(self, *, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class WithNew(ValueError):
    def __new__(cls, left: int, right: int) -> WithNew:
        self = super().__new__(cls, f"{left}+{right}")
        self.total = left + right
        return self


class Slotted(Exception):
    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        super().__init__()
        self.detail = detail


class HoldsLock(RuntimeError):
    def __init__(self) -> None:
        super().__init__("it holds a lock")
        self.lock = threading.Lock()


class ComputedMessage(NameError):
    """Like pandas' ``UndefinedVariableError``: the message is built from the arguments,
    so calling the class with ``args`` again garbles it."""

    def __init__(self, name: str, is_local: bool) -> None:
        kind = "local variable" if is_local else "name"
        super().__init__(f"{kind} {name!r} is not defined")


def raise_json() -> None:
    json.loads("not json")


def raise_unicode() -> None:
    b"ok \xff".decode("utf-8")


def raise_called_process() -> None:
    raise subprocess.CalledProcessError(
        returncode=3, cmd=["tool", "-x"], output="out", stderr="err"
    )


def raise_file_not_found() -> None:
    Path("/nonexistent/jre-test-file").read_text()


def raise_connection_refused() -> None:
    raise OSError(errno.ECONNREFUSED, "refused by the test")


def raise_key() -> None:
    _ = {"a": 1}["missing"]


def raise_keyword_only() -> None:
    raise KeywordOnly(code=7)


def raise_with_new() -> None:
    raise WithNew(2, 3)


def raise_slotted() -> None:
    raise Slotted("in a slot")


def raise_holds_lock() -> None:
    raise HoldsLock()


def raise_computed() -> None:
    raise ComputedMessage("mu", True)


#: Python 3.11+ (the project supports 3.10).
GROUP: Any = getattr(builtins, "ExceptionGroup", None)


def raise_group() -> None:
    raise GROUP("two things", [ValueError("first"), KeyError("second")])


CASES: list[tuple[Callable[[], None], type[BaseException], Callable[[Any], object]]] = [
    (raise_json, json.JSONDecodeError, lambda e: (e.msg, e.pos, e.lineno, e.colno)),
    (raise_unicode, UnicodeDecodeError, lambda e: (e.encoding, e.start, e.end, e.reason)),
    (
        raise_called_process,
        subprocess.CalledProcessError,
        lambda e: (e.returncode, e.cmd, e.output, e.stderr),
    ),
    (raise_file_not_found, FileNotFoundError, lambda e: (e.errno, e.filename, e.strerror)),
    (raise_connection_refused, ConnectionRefusedError, lambda e: (e.errno, e.strerror)),
    (raise_key, KeyError, lambda e: e.args),
    (raise_keyword_only, KeywordOnly, lambda e: (e.code, e.args)),
    (raise_with_new, WithNew, lambda e: (e.total, e.args)),
    (raise_slotted, Slotted, lambda e: e.detail),
    (raise_computed, ComputedMessage, lambda e: e.args),
]
if GROUP is not None:
    CASES.append((raise_group, GROUP, lambda e: [type(m).__name__ for m in e.exceptions]))


def local_outcome(raiser: Callable[[], None]) -> BaseException:
    try:
        raiser()
    except BaseException as exc:
        return exc
    raise AssertionError("it did not raise")


@pytest.mark.parametrize(
    ("raiser", "kind", "fields"), CASES, ids=[case[0].__name__ for case in CASES]
)
def test_caught_as_its_own_type_with_its_fields(
    agent_executor: LocalExecutor,
    raiser: Callable[[], None],
    kind: type[BaseException],
    fields: Callable[[Any], object],
) -> None:
    expected = local_outcome(raiser)
    with pytest.raises(kind) as info:
        jre.get(jre.remote(raiser).remote())
    error = info.value
    assert type(error) is not kind  # the dual class: a RemoteTaskError too
    assert isinstance(error, RemoteTaskError)
    assert fields(error) == fields(expected)
    cause = error.cause
    assert type(cause) is kind
    assert fields(cause) == fields(expected)
    assert str(cause) == str(expected)
    assert f"{kind.__name__}: {expected}" in str(error)
    assert raiser.__name__ in error.remote_traceback


def test_base_classes_catch_it_too(agent_executor: LocalExecutor) -> None:
    with pytest.raises(ValueError, match="Expecting value"):
        jre.get(jre.remote(raise_json).remote())
    with pytest.raises(OSError, match="No such file") as info:
        jre.get(jre.remote(raise_file_not_found).remote())
    assert info.value.errno == errno.ENOENT
    with pytest.raises(LookupError):
        jre.get(jre.remote(raise_key).remote())


def test_an_unpicklable_attribute_becomes_its_repr(agent_executor: LocalExecutor) -> None:
    with pytest.raises(HoldsLock) as info:
        jre.get(jre.remote(raise_holds_lock).remote())
    assert str(info.value.cause) == "it holds a lock"
    assert isinstance(info.value.lock, str)
    assert "lock" in info.value.lock


def test_a_class_defined_where_the_driver_runs(agent_executor: LocalExecutor) -> None:
    # Defined in a function, as a notebook defines it: pickled by value to the worker and
    # back, it must be this very class again.
    class NotebookError(Exception):
        def __init__(self, count: int, *, label: str) -> None:
            super().__init__(f"{label}: {count}")
            self.count = count

    def fail() -> None:
        raise NotebookError(4, label="apples")

    with pytest.raises(NotebookError) as info:
        jre.get(jre.remote(fail).remote())
    assert info.value.count == 4
    assert str(info.value.cause) == "apples: 4"


def test_a_class_the_driver_lacks_is_caught_by_its_base(
    agent_executor: LocalExecutor, tmp_path: Path
) -> None:
    module = tmp_path / "only_in_env"
    module.mkdir()
    (module / "envonly.py").write_text(
        "class NotFitted(ValueError, AttributeError):\n"
        "    def __init__(self, what, *, hint):\n"
        "        super().__init__(f'{what} is not fitted ({hint})')\n"
        "\n"
        "def fail():\n"
        "    raise NotFitted('model', hint='call fit first')\n"
    )

    def call() -> None:
        import envonly  # type: ignore[import-not-found]

        envonly.fail()

    assert "envonly" not in sys.modules
    f = jre.remote(runtime_env={"py_modules": [str(module / "envonly.py")]})(call)
    with pytest.raises(ValueError, match="model is not fitted") as info:
        jre.get(f.remote())
    assert isinstance(info.value, RemoteTaskError)
    assert info.value.remote_type == "envonly.NotFitted"
    assert "NotFitted: model is not fitted (call fit first)" in str(info.value)
    assert "envonly" not in sys.modules  # nothing was imported to rebuild it


def test_the_error_pickles_again(agent_executor: LocalExecutor) -> None:
    with pytest.raises(KeywordOnly) as info:
        jre.get(jre.remote(raise_keyword_only).remote())
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, KeywordOnly)
    assert isinstance(again, RemoteTaskError)
    assert again.code == 7
