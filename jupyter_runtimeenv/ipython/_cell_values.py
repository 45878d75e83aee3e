"""The names of one transfer between the kernel and a remote namespace, pickled together.

Who calls it: ``remote_cell`` (the notebook variables a cell sends), ``_cell_runner`` in the
worker (loading them; pickling ``--out`` names and the names a notebook cell brings back) and
``_remote_values`` (loading those in the kernel). Shipped by value with the cell runner:
the standard library and cloudpickle only (numpy only if the values are its arrays).

What two names share stays shared across a transfer, as it is on the side they come from:
``fig, ax = plt.subplots()`` in a remote cell, then ``ax.set(...); fig`` in a notebook cell
brings back one figure that ``ax`` belongs to, not two copies; ``y = x`` comes back as one
list. The names are pickled one after another by one pickler into one stream (``dump``), so
its memo spans them all (an object met again is a reference to the first), and loaded one
after another by one unpickler (``load``). A NumPy array that is a view of another array
of the same transfer is pickled as a view of it (pickle copies a view's data on its own).

Large buffers (a NumPy array's data, a DataFrame's blocks) are taken out of the stream
(pickle protocol 5) and travel as the bundle's ``buffers``: the executor hands those to
shared memory like a task's arguments (``workers/shm``), and the side that loads builds the
arrays on them without a copy.

One name that fails does not lose the others: a name that cannot be pickled is left out of
the stream and named with its cause (``problems``); a name that cannot be loaded is named
with its exception, and so is each later name that refers to an object of it; the rest load.

``aliases`` names what a change in place reaches besides the name changed (``y`` of ``y =
x`` when a cell runs ``x.append(4)``): the kernel counts those as changed too, on the side
that changed them.
"""

from __future__ import annotations

from typing import Any


class SharesFailed(Exception):
    """A name that refers to an object of a name that did not load (not loaded either)."""


class _Missing:
    """Stands in the memo for the objects of a name that did not load (never read: the
    names that refer to them are not loaded)."""


def _pickler_class() -> Any:
    import importlib
    import sys

    import cloudpickle

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # untyped
        """``cloudpickle.Pickler``, but a class whose module is not imported yet is
        imported first (cloudpickle would pickle it by value, and the copy is another
        class where it loads: ``numpy.recarray``'s module ``numpy.rec`` is loaded lazily),
        and an array whose memory a named array carries is pickled as a view of it."""

        holders: dict[int, Any] = {}  # set per instance in ``dump``

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, type):
                module = getattr(obj, "__module__", None)
                if isinstance(module, str) and module not in sys.modules:
                    try:  # noqa: SIM105 - the worker imports as little as it can
                        importlib.import_module(module)
                    except Exception:  # not importable: cloudpickle's own choice
                        pass
            elif self.holders and type(obj).__name__ == "ndarray":
                view = _as_view(obj, self.holders)
                if view is not None:
                    return view
            return super().reducer_override(obj)

    return Pickler


def _holders(values: Any) -> dict[int, Any]:
    """For each block of memory that named arrays of the transfer use: the one array that
    carries it (the largest contiguous one), by the id of the object that owns the memory."""
    import sys

    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    if ndarray is None:
        return {}
    holders: dict[int, Any] = {}
    for value in values:
        if type(value) is not ndarray or not value.size:
            continue
        if not (value.flags.c_contiguous or value.flags.f_contiguous):
            continue
        owner = id(value if value.base is None else value.base)
        held = holders.get(owner)
        if held is None or value.nbytes > held.nbytes:
            holders[owner] = value
    return holders


def _as_view(array: Any, holders: dict[int, Any]) -> Any:
    """``(rebuild, args)`` of ``array`` as a view of the array that carries its memory in
    this transfer, or None (pickled as itself: it carries it, or none does)."""
    holder = holders.get(id(array if array.base is None else array.base))
    if holder is None or holder is array or type(array) is not type(holder) or not array.size:
        return None
    if array.dtype.hasobject or holder.dtype.hasobject:  # no buffer of objects
        return None
    start, end = _bounds(array)
    first, last = _bounds(holder)
    if start < first or end > last:
        return None
    offset = array.__array_interface__["data"][0] - first
    args = (holder, array.shape, array.dtype, offset, array.strides, array.flags.writeable)
    return _view, args


def _bounds(array: Any) -> tuple[int, int]:
    """The first and one past the last byte ``array`` uses."""
    low = high = array.__array_interface__["data"][0]
    for size, stride in zip(array.shape, array.strides, strict=True):
        if stride < 0:
            low += (size - 1) * stride
        else:
            high += (size - 1) * stride
    return low, high + array.itemsize


def _view(base: Any, shape: Any, dtype: Any, offset: int, strides: Any, writeable: bool) -> Any:
    view = type(base)(shape, dtype, buffer=base, offset=offset, strides=strides)
    if not writeable:
        view.flags.writeable = False
    return view


def dump(values: dict[str, Any], out_of_band: bool = True) -> dict[str, Any]:
    """The bundle of ``values``: ``stream`` (the pickles, one after another), ``names`` and
    ``ends`` (each pickle's end in the stream), ``buffers`` (``pickle.PickleBuffer``s taken
    out of the stream when ``out_of_band``), ``problems`` (name -> why it could not be
    pickled)."""
    import io

    problems: dict[str, str] = {}
    names = list(values)
    pickler_class = _pickler_class()
    while True:
        stream = io.BytesIO()
        buffers: list[Any] = []
        pickler = pickler_class(
            stream, protocol=5, buffer_callback=buffers.append if out_of_band else None
        )
        pickler.holders = _holders(values[n] for n in names)
        ends: list[int] = []
        failed = None
        for name in names:
            try:
                pickler.dump(values[name])
            except Exception as exc:
                problems[name] = f"{type(exc).__name__}: {exc}"
                failed = name
                break
            ends.append(stream.tell())
        if failed is None:
            return {
                "stream": stream.getvalue(),
                "names": names,
                "ends": ends,
                "buffers": buffers,
                "problems": problems,
            }
        # Its half-written pickle and memo entries are in the stream: again without it.
        names = [n for n in names if n != failed]


def aliases(namespace: dict[str, Any], names: list[str]) -> list[str]:
    """The other names of ``namespace`` bound to the object of one of ``names`` (a NumPy
    array: to an array on the same memory): what a change in place of one changes too
    (``y = x``, then ``x.append(4)``)."""
    owners = {_owner(namespace[n]) for n in names if n in namespace and _mutable(namespace[n])}
    if not owners:
        return []
    return [
        name
        for name, value in namespace.items()
        if name not in names
        and not name.startswith("_")
        and _mutable(value)
        and _owner(value) in owners
    ]


def _owner(value: Any) -> int:
    base = getattr(value, "base", None) if type(value).__name__ == "ndarray" else None
    return id(value if base is None else base)


def _mutable(value: Any) -> bool:
    import types

    atoms = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range)
    kinds = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    return not isinstance(value, atoms + kinds)


def segment(bundle: dict[str, Any], name: str) -> bytes:
    """The pickle of ``name`` alone (its references to earlier names' objects unresolved):
    to read which modules it names."""
    index = bundle["names"].index(name)
    start = bundle["ends"][index - 1] if index else 0
    return bytes(bundle["stream"][start : bundle["ends"][index]])


def load(bundle: dict[str, Any]) -> tuple[dict[str, Any], dict[str, BaseException]]:
    """The values of ``bundle``'s names, and the exception of each that did not load."""
    import io
    import pickle

    names: list[str] = bundle.get("names") or []
    if not names:
        return {}, {}
    buffers = list(bundle.get("buffers") or ())
    unpickler = pickle.Unpickler(io.BytesIO(bundle["stream"]), buffers=buffers)
    values: dict[str, Any] = {}
    for index, name in enumerate(names):
        try:
            values[name] = unpickler.load()
        except Exception as exc:
            failed: dict[str, BaseException] = {name: exc}
            memo = unpickler.memo.copy()
            _load_rest(bundle, index, buffers, memo, values, failed)
            return values, failed
    return values, {}


def _load_rest(
    bundle: dict[str, Any],
    failed_at: int,
    buffers: list[Any],
    memo: dict[int, Any],
    values: dict[str, Any],
    failed: dict[str, BaseException],
) -> None:
    """After the name at ``failed_at`` did not load: each later name is loaded by itself,
    with the memo so far, unless it refers to an object of a name that did not load."""
    import io
    import pickle

    names: list[str] = bundle["names"]
    stream, ends = bundle["stream"], bundle["ends"]
    spans = _scan(stream, ends)
    gone: dict[int, str] = {}  # memo index -> the name that did not load, whose it is
    for slot in spans[failed_at][0]:
        gone[slot] = names[failed_at]
    for index in range(failed_at + 1, len(names)):
        name = names[index]
        defines, refers, used = spans[index]
        shared = [gone[slot] for slot in refers if slot in gone]
        if shared:
            failed[name] = SharesFailed(
                f"it shares an object with {shared[0]!r}, which did not load"
            )
            gone.update(dict.fromkeys(defines, name))
            continue
        top = max([*memo, *gone], default=-1) + 1
        for slot in range(top):
            memo.setdefault(slot, _Missing)
        start = ends[index - 1] if index else 0
        first = sum(spans[i][2] for i in range(index))
        # Python's own unpickler: its memo is a dict that may be given (the C one's
        # setter drops a dict's entries, Python 3.11), and this path is rare.
        unpickler: Any = pickle._Unpickler(
            io.BytesIO(stream[start : ends[index]]), buffers=buffers[first : first + used]
        )
        unpickler.memo = memo
        try:
            values[name] = unpickler.load()
        except Exception as exc:
            failed[name] = exc
            gone.update(dict.fromkeys(defines, name))
        memo = unpickler.memo


def _scan(stream: bytes, ends: list[int]) -> list[tuple[set[int], set[int], int]]:
    """Of each name's pickle: the memo indices it defines, those of earlier pickles it
    refers to, and how many out-of-band buffers it takes."""
    import pickletools

    out = []
    count = 0  # MEMOIZE's index: the memo's size, which goes on across the pickles
    for index, end in enumerate(ends):
        pickle = stream[(ends[index - 1] if index else 0) : end]
        defines: set[int] = set()
        refers: set[int] = set()
        used = 0
        for opcode, arg, _pos in pickletools.genops(pickle):
            if opcode.name == "MEMOIZE":
                defines.add(count)
                count += 1
            elif opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                defines.add(int(arg or 0))
            elif opcode.name in ("GET", "BINGET", "LONG_BINGET"):
                if int(arg or 0) not in defines:
                    refers.add(int(arg or 0))
            elif opcode.name == "NEXT_BUFFER":
                used += 1
        out.append((defines, refers, used))
    return out
