"""An exception taken apart into plain pieces, and put together again without its ``__init__``.

Who uses it: the worker bootstrap (``workers/_entry.py`` loads this file by path, so it may
import the standard library only), the ``%%remote`` cell runner (shipped by value) and, in
the driver, ``serialize.load_outcome``, the ``%%remote`` magic and ``errors.RemoteTaskError``
(``rebuild``, with cloudpickle's ``loads``).

Why not pickle the exception: unpickling calls ``cls(*self.args)``, which fails or garbles
the message for classes whose ``__init__`` takes other arguments than it stores in ``args``
(keyword-only arguments, a message computed from a name, like pandas'
``UndefinedVariableError``), a custom ``__new__``, or an attribute that cannot be pickled;
the driver then had no instance of the original type to raise. ``describe`` keeps the
class, ``args``, ``__dict__``, the values of ``__slots__`` and of C-level fields
(``OSError.errno``, ``UnicodeError.start``...), each pickled on its own (its ``repr`` when it
cannot be), and the names of the class and its bases for a driver that cannot load the
class. ``blank`` + ``restore`` rebuild an instance the way ``copy`` does: through the
nearest built-in base's ``__new__``, never calling a user-defined ``__new__`` or ``__init__``.

In the driver, ``rebuild`` unpickles the class (by reference, or by value for a class
defined in the notebook, which then is the notebook's own class again). A value that cannot
be unpickled there becomes its ``repr``; a class the driver cannot load (its module is only
in the env) is replaced by its nearest base the driver has (``ValueError`` for
scikit-learn's ``NotFittedError``), and the real name is returned with it.
"""

from __future__ import annotations

import builtins
import importlib
import sys
import types

TYPE_CHECKING = False  # the bootstrap loads this file: typing costs ~3 ms at its start
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: Fields every exception has, which ``describe``/``restore`` treat apart (or not at all).
_SKIP = frozenset(
    {
        "__dict__",
        "__weakref__",
        "args",
        "__traceback__",
        "__context__",
        "__cause__",
        "__suppress_context__",
        # a group's message and members are constructor arguments (read-only fields)
        "message",
        "exceptions",
    }
)
_DESCRIPTORS = (types.MemberDescriptorType, types.GetSetDescriptorType)
_GROUP = getattr(builtins, "BaseExceptionGroup", None)
_UNSET = object()


def fields(exc: BaseException) -> dict[str, Any]:
    """The instance's state beyond ``args``: ``__dict__``, slots and C-level fields."""
    state: dict[str, Any] = {}
    for klass in reversed(type(exc).__mro__):
        if klass is object or klass is BaseException:
            continue
        for name, attr in vars(klass).items():
            if name in _SKIP or not isinstance(attr, _DESCRIPTORS):
                continue
            try:
                state[name] = getattr(exc, name)
            except AttributeError:  # an empty slot, an unset field
                continue
    state.update(getattr(exc, "__dict__", None) or {})
    return state


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as failure:  # a broken __str__ must not lose the error itself
        return f"<{type(exc).__name__}: str() failed: {failure!r}>"


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception as failure:
        return f"<{type(value).__name__} object (repr failed: {failure!r})>"


def _piece(value: object, dumps: Callable[[object], bytes]) -> tuple[str, Any]:
    try:
        return ("pickle", dumps(value))
    except Exception:
        return ("repr", _safe_repr(value))


def describe(exc: BaseException, dumps: Callable[[object], bytes]) -> dict[str, Any]:
    """``exc`` as plain values (``pickle`` can carry them): see the module docstring."""
    kind = type(exc)
    try:
        cls: bytes | None = dumps(kind)
    except Exception:
        cls = None
    members = None
    if _GROUP is not None and isinstance(exc, _GROUP):
        members = [describe(member, dumps) for member in exc.exceptions]
    return {
        "class": cls,
        "mro": [[k.__module__, k.__qualname__] for k in kind.__mro__ if k is not object],
        "args": [_piece(arg, dumps) for arg in exc.args],
        "state": {name: _piece(value, dumps) for name, value in fields(exc).items()},
        "message": safe_str(exc),
        "group": members,
    }


def builtin_base(cls: type) -> Any:
    """The nearest base of ``cls`` defined in C (its ``__new__`` is safe to call)."""
    return next(k for k in cls.__mro__ if k.__module__ == "builtins")


def blank(cls: type[BaseException], args: tuple[Any, ...], group: Any = None) -> BaseException:
    """An instance of ``cls`` with ``args``, made without its ``__new__``/``__init__``.

    ``group`` is ``(message, exceptions)`` for an exception group (its C ``__new__`` needs
    them). A ``TypeError`` means ``cls`` cannot be instantiated this way.
    """
    base = builtin_base(cls)
    exc: BaseException = base.__new__(cls, *group) if group is not None else base.__new__(cls)
    exc.args = args
    return exc


def restore(exc: BaseException, state: dict[str, Any]) -> None:
    """Set ``state`` (from ``fields``) on ``exc``: ``__dict__`` entries directly (as pickle
    does), slots and C-level fields through their descriptors; a read-only one is skipped."""
    slots: dict[str, Any] = {}
    for klass in type(exc).__mro__:
        for name, attr in vars(klass).items():
            if isinstance(attr, _DESCRIPTORS) and name not in _SKIP:
                slots.setdefault(name, attr)
    namespace = getattr(exc, "__dict__", None)
    for name, value in state.items():
        descriptor = slots.get(name)
        if descriptor is not None:
            # Unset C fields read as None; setting None would differ (OSError's str shows a
            # filename2 that is None but set).
            if getattr(exc, name, _UNSET) is value:
                continue
            try:  # noqa: SIM105 - contextlib is not imported in the worker's bootstrap
                descriptor.__set__(exc, value)
            except (AttributeError, TypeError, ValueError):
                pass  # read-only or of another type in this class: keep the blank one
        elif namespace is not None:
            namespace[name] = value


def rebuild(
    description: dict[str, Any] | None, loads: Callable[[bytes], Any]
) -> tuple[BaseException | None, str]:
    """``(the exception, its remote class's qualified name)``; ``(None, "")`` without one."""
    if not description:
        return None, ""
    mro = [(str(entry[0]), str(entry[1])) for entry in description.get("mro", [])]
    remote_type = _qualified(*mro[0]) if mro else ""
    cls = _load_class(description.get("class"), loads) or _nearest_class(mro)
    args = tuple(_unpiece(piece, loads) for piece in description.get("args", []))
    group = None
    if description.get("group") is not None:
        members = [rebuild(member, loads)[0] for member in description["group"]]
        group = (str(args[0]) if args else "", [m for m in members if m is not None])
    try:
        exc = blank(cls, args, group)
    except TypeError:  # e.g. a group whose members did not all come back
        exc = Exception(*args)
    pieces = description.get("state", {})
    restore(exc, {name: _unpiece(piece, loads) for name, piece in pieces.items()})
    return exc, remote_type


def _qualified(module: str, qualname: str) -> str:
    return qualname if module == "builtins" else f"{module}.{qualname}"


def _load_class(blob: bytes | None, loads: Callable[[bytes], Any]) -> type[BaseException] | None:
    if blob is None:
        return None
    try:
        cls = loads(blob)
    except Exception:  # its module is only in the env, or a class by value broke
        return None
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


def _nearest_class(mro: list[tuple[str, str]]) -> type[BaseException]:
    """The first class of the remote MRO this process has, importing nothing but the
    standard library for it (importing a module of the env's could run anything)."""
    for module, qualname in mro:
        owner: Any = builtins if module == "builtins" else sys.modules.get(module)
        if owner is None and module.partition(".")[0] in sys.stdlib_module_names:
            try:
                owner = importlib.import_module(module)
            except Exception:
                owner = None
        for part in qualname.split(".") if owner is not None else ():
            owner = getattr(owner, part, None)
        if isinstance(owner, type) and issubclass(owner, BaseException):
            return owner
    return Exception


def _unpiece(piece: Any, loads: Callable[[bytes], Any]) -> Any:
    kind, data = piece
    if kind != "pickle":
        return data
    try:
        return loads(data)
    except Exception as exc:
        return f"<cannot be unpickled here: {type(exc).__name__}: {exc}>"
