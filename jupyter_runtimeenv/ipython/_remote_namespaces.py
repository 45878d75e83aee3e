"""The kernel's side of the remote namespaces of ``%%remote`` cells (one per env).

A notebook's ``%%remote`` cells of one env share a namespace that lives in one worker of
that env (the pool keeps the worker for it: ``Task.affinity`` = ``RemoteNamespace.key``),
as ipyparallel's ``%%px`` cells share an engine's. This module keeps what the kernel knows
of each: its worker, the cells run, the names it holds, and which of them a remote cell
changed last, which decides what the next cell is sent:

    a name goes with a cell if the cell reads it and the notebook has it, unless a remote
    cell changed it last (assigned it, or changed it in place: ``df['c'] = ...``): then the
    remote namespace's value is used, until the notebook binds the name again or changes
    it in place in one of its own cells.

So a model fitted in one remote cell is scored in the next even if the kernel cannot
unpickle it (or has another value under that name), and a DataFrame edited locally is sent
again. The common methods that change their object (``lst.append(x)``, ``inplace=True``,
any draw from a random generator) and functions that change their argument (``next(it)``,
``np.add.at(counts, ...)``) count as changes; others (a function of the notebook's) are not
seen: ``--in`` sends a name whatever the rule says. The same rule the other way: a
notebook cell that reads a name whose newest value is in a remote namespace (``stale``) gets
it first (``_remote_fetch``).

Who calls it: ``remote_cell`` (before and after each cell, ``--fresh``, ``%remote --list``),
``_remote_fetch`` and IPython's ``post_run_cell`` event for the notebook's own cells
(``track_local_cell``).
"""

from __future__ import annotations

import ast
import itertools
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from ._cell_values import aliases
from ._remote_code import method_receivers, names_changed, stateful

__all__ = ["RemoteNamespace", "forget_all", "namespace_for", "namespaces", "track_local_cell"]

#: The id recorded for a name the notebook did not have when a remote cell changed it.
_ABSENT = -1
_counter = itertools.count(1)
_ticks = itertools.count(1)
_lock = threading.Lock()
_spaces: dict[str, RemoteNamespace] = {}


@dataclass
class RemoteNamespace:
    """One env's remote namespace, as the kernel knows it."""

    label: str  # how the user names the env: "(default)", or its name
    env_id: str  # with the local code as it is now (``spec.refresh``)
    declared_id: str = ""  # as declared: the same while only the local code changes
    key: str = ""
    pid: int = 0
    cells: int = 0
    names: list[str] = field(default_factory=list)
    #: name -> id() of the notebook's value when a remote cell changed the name last.
    remote_owned: dict[str, int] = field(default_factory=dict)
    #: Names a remote cell changed whose newest value the notebook does not have yet.
    stale: set[str] = field(default_factory=set)
    #: When its last cell ended (a count across namespaces: the newest binding wins).
    tick: int = 0
    #: The spec its cells ran with, and the kernel's matplotlib style its worker has.
    spec: Any = None
    style_sent: Any = None
    #: The kernel's display printers its worker has (``_remote_printers``' fingerprint).
    printers_sent: Any = None
    #: The executor whose worker holds it: another one (``init``, ``shutdown``) holds none.
    owner: Any = None
    #: A file of the names it takes over from the namespace it replaced, which its first
    #: cell loads (``_remote_handover``).
    seed: str = ""

    def __post_init__(self) -> None:
        self.renew()

    def held_by(self, executor: object) -> bool:
        """Whether ``executor`` is the one this namespace was started in; if not, the
        namespace starts over in it (the session's executor was replaced)."""
        if self.owner is not None and self.owner() is executor:
            return True
        fresh = self.owner is None and not self.cells
        self.renew()
        self.owner = weakref.ref(executor)
        return fresh

    def renew(self) -> None:
        """A new, empty namespace (``--fresh``, a lost worker): a key no worker knows."""
        self.key = f"%%remote:{os.getpid()}:{next(_counter)}:{self.env_id[:12]}"
        self.pid, self.cells, self.names = 0, 0, []
        self.forget_values()

    def forget_values(self) -> None:
        """Nothing of the notebook's is held there (a new or lost worker)."""
        self.remote_owned.clear()
        self.stale.clear()
        self.style_sent = None
        self.printers_sent = None

    def expected(self) -> dict[str, Any] | None:
        """What the worker should already hold (it says so when it does not)."""
        if not self.cells:
            return None
        return {"pid": self.pid, "names": self.names}

    def to_send(self, reads: list[str], user_ns: dict[str, Any]) -> list[str]:
        """Of the names a cell reads that the notebook has, those it must send."""
        missing = object()
        out = []
        for name in reads:
            value = user_ns.get(name, missing)
            if value is missing:
                continue
            owned = self.remote_owned.get(name)
            if owned is not None and owned == id(value):
                continue  # a remote cell changed it last: the namespace has the newest
            self.remote_owned.pop(name, None)
            out.append(name)
        return out

    def after_cell(
        self,
        info: dict[str, Any],
        changed: list[str],
        user_ns: dict[str, Any],
        brought_back: dict[str, Any],
    ) -> None:
        """Record a finished cell: its worker, and the names it changed (``changed``) or
        brought back (``brought_back``, now the same object on both sides)."""
        if info.get("created") and self.cells:
            self.forget_values()  # a new namespace: whatever it held is gone
        self.tick = next(_ticks)
        self.pid = int(info.get("pid") or 0)
        self.cells = int(info.get("cells") or self.cells + 1)
        self.names = list(info.get("names") or [])
        for name in changed:
            self.remote_owned[name] = id(user_ns[name]) if name in user_ns else _ABSENT
            self.stale.add(name)
        for name, value in brought_back.items():
            self.remote_owned[name] = id(value)
            self.stale.discard(name)

    def newer_here(self, name: str, user_ns: dict[str, Any]) -> bool:
        """Whether this namespace holds a newer value of ``name`` than the notebook: a
        remote cell changed it last, and the notebook has not bound it since."""
        owned = self.remote_owned.get(name)
        if owned is None or name not in self.stale:
            return False
        return owned == (id(user_ns[name]) if name in user_ns else _ABSENT)

    def lost(self, keep_key: bool = False) -> str:
        """Say the namespace is gone (its worker was killed or died) and start over:
        with a new key, or (``keep_key``) the same one, when no worker holds it any more
        but one may already be kept for it again."""
        held = ", ".join(self.names[:10]) + (" ..." if len(self.names) > 10 else "")
        text = f"the remote namespace of {self.label} was lost with it" + (
            f" (it held {held})" if held else ""
        )
        if keep_key:
            self.pid, self.cells, self.names = 0, 0, []
            self.forget_values()
        else:
            self.renew()
        return text

    def describe(self) -> str:
        where = f"worker pid {self.pid}" if self.pid else "no worker yet"
        held = ", ".join(self.names[:20]) + (" ..." if len(self.names) > 20 else "")
        return (
            f"{self.label} (env {self.env_id[:12]}): {where}, {self.cells} cell(s),"
            f" {len(self.names)} name(s){': ' + held if held else ''}"
        )


def namespace_for(
    label: str, env_id: str, declared_id: str
) -> tuple[RemoteNamespace, RemoteNamespace | None]:
    """The namespace of env ``label`` (its env id with the local code as it is now, and as
    declared), and the one it replaces when the env changed since its last cell (whose
    worker the caller lets go)."""
    with _lock:
        current = _spaces.get(label)
        if current is not None and current.env_id == env_id:
            return current, None
        fresh = _spaces[label] = RemoteNamespace(label, env_id, declared_id)
        return fresh, current


def namespaces() -> list[RemoteNamespace]:
    with _lock:
        return list(_spaces.values())


def forget_all() -> list[RemoteNamespace]:
    """Drop every namespace (the session was shut down); returns them."""
    with _lock:
        gone = list(_spaces.values())
        _spaces.clear()
    return gone


def track_local_cell(result: Any) -> None:
    """IPython's ``post_run_cell``: names the notebook's own cell changed are the
    notebook's again (``df['c'] = ...`` on a DataFrame a remote cell defined and --out; a
    draw from a random generator)."""
    if not _spaces:
        return
    info = getattr(result, "info", None)
    raw = getattr(info, "raw_cell", None) or ""
    if not raw.lstrip().startswith("%%remote"):
        _hint_remote_name(getattr(result, "error_in_exec", None))
    source = getattr(info, "transformed_cell", None) or raw
    if not source:
        return
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    from IPython import get_ipython

    user_ns = getattr(get_ipython(), "user_ns", None) or {}
    changed = names_changed(tree)
    changed += [n for n in method_receivers(tree) if stateful(user_ns.get(n))]
    changed += aliases(user_ns, changed)  # ``y`` of ``y = x``, after ``x.append(4)``
    for space in namespaces():
        for name in changed:
            space.remote_owned.pop(name, None)
            space.stale.discard(name)


def _hint_remote_name(error: object) -> None:
    """A notebook cell's NameError for a name that a remote namespace holds: one line saying
    where it is and the two ways to reach it (the traceback is IPython's, just above)."""
    name = getattr(error, "name", None) if isinstance(error, NameError) else None
    if not isinstance(name, str):
        return
    for space in namespaces():
        if name in space.names:
            print(
                f"%%remote: {name!r} is in the remote namespace of {space.label}, not in the"
                f" notebook: run this cell with %%remote, or add --out {name} to the %%remote"
                " cell that makes it",
                file=sys.stderr,
            )
            return
