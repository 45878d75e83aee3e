"""The printers a notebook registered on IPython's display formatter reach its remote cells.

sympy's ``init_printing()`` in a notebook cell registers, for sympy's types, a pretty
``text/plain``, a drawn ``image/png`` and ``text/latex`` on the kernel's
``display_formatter``; ``formatters['text/html'].for_type(MyClass, f)`` does the same by
hand. A ``%%remote`` cell's value is formatted in its worker, which knew none of them: the
value of the next remote cell showed as ``(x + pi)**2`` where a notebook cell shows the
formula (scientific-python-lectures' Lecture-5, every other cell remote: 33 of 90 cells).
So the printers the kernel has beyond a fresh formatter's go with a remote cell, pickled one
by one, when they changed since its worker last took them (as the matplotlib style does),
and the worker registers them on its own formatter (``_cell_display.add_printers``). A
printer that cannot be pickled stays in the kernel; the figure printers of the inline
backend stay too (the worker draws figures itself, in the kernel's formats).

Who calls it: ``remote_cell``, for each cell.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

__all__ = ["kernel_printers"]

#: Types whose printers the worker makes itself (``_cell_figures``).
_OWN_TYPES = frozenset({"matplotlib.figure.Figure"})
_pristine: Any = None


def kernel_printers(shell: Any, known: Any = None) -> tuple[tuple[Any, ...], list[bytes]]:
    """``(fingerprint, printers)``: the fingerprint tells what changed (the printers'
    identities); each printer is a pickle of ``(mime, type or (module, name), function)``,
    made only when the fingerprint is not ``known`` (what the worker has: pickling sympy's
    22 printers takes ~3 ms, not to be paid by every cell)."""
    global _pristine
    formatter = getattr(shell, "display_formatter", None)
    formatters = getattr(formatter, "formatters", None)
    if not isinstance(formatters, dict):
        return (), []
    if _pristine is None:
        from IPython.core.formatters import DisplayFormatter

        _pristine = DisplayFormatter()
    entries: list[tuple[str, Any, Any]] = []
    for mime, one in formatters.items():
        base = _pristine.formatters.get(mime)
        if base is None:
            continue
        for kind, printer in getattr(one, "type_printers", {}).items():
            if base.type_printers.get(kind) is not printer and _name(kind) not in _OWN_TYPES:
                entries.append((mime, kind, printer))
        for key, printer in getattr(one, "deferred_printers", {}).items():
            if base.deferred_printers.get(key) is not printer and ".".join(key) not in _OWN_TYPES:
                entries.append((mime, tuple(key), printer))
    fingerprint = tuple(sorted((m, _name(k), id(p)) for m, k, p in entries))
    blobs: list[bytes] = []
    if fingerprint == known:
        return fingerprint, blobs
    for entry in entries:
        try:
            blobs.append(cloudpickle.dumps(entry))
        except Exception:  # stays in the kernel: the worker formats that type its own way
            continue
    return fingerprint, blobs


def _name(kind: Any) -> str:
    if isinstance(kind, tuple):
        return ".".join(kind)
    return f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', kind)}"
