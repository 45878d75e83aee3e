"""Values crossing between the kernel and an env: unpickled here, or a one-line reason why not.

Who calls it: ``remote_cell`` for ``--out`` values (and an input the worker could not
unpickle), ``_remote_fetch`` for the values a notebook cell brings back. A value that does
not cross is named with its cause: the package the kernel lacks (``scikit-learn is not
installed in this kernel (the env has 1.5.2)``), or the packages whose versions differ
between the env and the kernel, both versions given (``pandas 2.2.3 in the env, 3.1.1
here``): the usual reason a pickle of one version does not load in another. The worker
sends, with each value, the versions of the packages its pickle names
(``_cell_runner.versions``); this side compares them with its own.
"""

from __future__ import annotations

from typing import Any

from ._cell_runner import versions
from ._cell_values import SharesFailed
from ._cell_values import load as load_names

__all__ = ["Unloadable", "load_all", "mismatch"]


class Unloadable(Exception):
    """A value that cannot be unpickled here; the message is one line, its cause."""


def load_all(bundle: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Unloadable]]:
    """The values of a bundle of names (``_cell_runner._outputs``: pickled together, so
    what they share is shared here too), and ``Unloadable`` with its cause for each name
    that could not be pickled in the worker or unpickled here."""
    unloadable: dict[str, Unloadable] = {}
    for name, problem in (bundle.get("problems") or {}).items():
        unloadable[name] = Unloadable(f"it cannot be pickled in the worker: {problem or '?'}")
    if not bundle.get("names"):
        return {}, unloadable
    values, failed = load_names(bundle)
    modules = bundle.get("modules") or {}
    for name, exc in failed.items():
        why = str(exc) if isinstance(exc, SharesFailed) else None
        unloadable[name] = Unloadable(why or explain(exc, modules.get(name) or {}, "kernel"))
    return values, unloadable


def explain(exc: BaseException, theirs: dict[str, list[str]], into: str) -> str:
    """Why a pickle did not load, in one line. ``into`` is where it failed to load:
    ``"kernel"`` (made in the env, whose versions are ``theirs``) or ``"env"`` (made here,
    ``theirs`` being the env's versions of the packages it names)."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    if missing:
        top = missing.partition(".")[0]
        if into == "kernel":
            dist, version = (theirs.get(top) or [top, ""])[:2]
            has = f" (the env has {version})" if version else ""
            return f"{dist} is not installed in this kernel{has}"
        dist, version = versions([top]).get(top, [top, ""])[:2]
        has = f" (this kernel has {version})" if version else ""
        return f"{dist} is not installed in the env{has}"
    differ = mismatch(theirs)
    cause = f"{type(exc).__name__}: {_first_line(exc)}"
    return f"{cause}; {differ}" if differ else cause


def mismatch(theirs: dict[str, list[str]]) -> str:
    """``pandas 2.2.3 in the env, 3.1.1 here`` for each package whose versions differ."""
    ours = versions(list(theirs))
    parts = []
    for top, (dist, version) in theirs.items():
        mine = ours.get(top, [dist, ""])[1]
        if version and mine and version != mine:
            parts.append(f"{dist} {version} in the env, {mine} here")
        elif version and not mine:
            parts.append(f"{dist} {version} in the env, not installed here")
    return "; ".join(parts)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."
