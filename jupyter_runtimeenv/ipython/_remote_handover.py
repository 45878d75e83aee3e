"""A remote namespace moves to a new worker when its env's local code changed: the kernel's
half (``_cell_handover`` is the workers').

An env with a working dir is another env once a file in it changes (a notebook cell that
writes ``results.csv`` there, a module edited): its next ``%%remote`` cell must run in a
worker of the new env, to see the new files. Before this, the names of the remote
namespace were lost with the old worker (``from numpy import *`` in a remote cell, then
``np.savetxt`` in a notebook cell: the next remote cell had no ``dot``). Now the old worker
writes them into a file as its last call (``_cell_runner.export_namespace``: one pickler for all,
each name apart), and the new namespace's first cell loads them before it runs; what the
kernel knows of them (which names a remote cell changed last) goes along. A name that
cannot be pickled (a lock, an open file) stays behind, named with its cause. Local
executors only: the new worker is on the same machine.

Who calls it: ``remote_cell`` (``_namespace``, when the env changed since its last cell).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from typing import Any

from . import _cell_runner
from ._remote_namespaces import RemoteNamespace

__all__ = ["carry", "dropped", "replace"]


def replace(executor: Any, old: RemoteNamespace, new: RemoteNamespace, declared_id: str) -> str:
    """``new`` replaces ``old`` (its env changed since its last cell): ``old``'s names move
    into ``new`` when only the env's local code changed, and its worker is let go. What the
    line that reports it says after "changed since its last remote cell" (empty: nothing to
    say, ``old`` ran no cell in this executor)."""
    ours = bool(old.cells) and old.owner is not None and old.owner() is executor
    moved = old.declared_id == declared_id  # only its local code changed
    try:
        if ours and moved and getattr(executor, "keeps_affinity", False):
            new.owner = old.owner
            told = carry(executor, old, new)
        else:
            told = _lost(old, "")
    finally:
        release = getattr(executor, "release_affinity", None)
        if release is not None:
            release(old.key)
    if not ours:
        return ""
    why = "its local code changed (working_dir, py_modules)" if moved else "it was declared again"
    return f"({why}): {told}"


def carry(executor: Any, old: RemoteNamespace, new: RemoteNamespace) -> str:
    """Move ``old``'s names into ``new`` (its first cell loads them: ``new.seed``); what
    the line that reports the change says of them. Raises ``KeyboardInterrupt`` as a
    cell's wait does (the old worker is then killed)."""
    if executor.affinity_pid(old.key) is None:
        return _lost(old, "its worker is gone")
    path = os.path.join(tempfile.gettempdir(), f"jre-namespace-{secrets.token_hex(8)}.pickle")
    future = executor.submit(
        _cell_runner.export_namespace,
        (old.key, path),
        {},
        runtime_env=old.spec,
        name="%%remote namespace",
        affinity=old.key,
    )
    try:
        result: dict[str, Any] = future.result()
    except KeyboardInterrupt:
        future.cancel()
        dropped(path)
        raise
    except Exception as exc:
        dropped(path)
        return _lost(old, f"moving its names failed: {str(exc).splitlines()[0][:200]}")
    if result.get("missing"):
        dropped(path)
        return _lost(old, "its worker did not hold it")
    carried: list[str] = result["carried"]
    lost: dict[str, str] = result["lost"]
    new.seed = path
    new.names = list(carried)
    new.remote_owned = {n: i for n, i in old.remote_owned.items() if n not in lost}
    new.stale = {n for n in old.stale if n not in lost}
    if not carried and not lost:
        return "this cell starts a new remote namespace (the old one held nothing)"
    held = ", ".join(carried[:10]) + (f" and {len(carried) - 10} more" if len(carried) > 10 else "")
    text = f"its names move to a new worker ({held or 'none'})"
    if lost:
        text += "; these cannot be pickled and are lost: " + "; ".join(
            f"{name} ({why})" for name, why in sorted(lost.items())
        )
    return text


def dropped(path: str) -> None:
    """Remove a handover file nobody will load (a failed move, a cell that never ran)."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _lost(old: RemoteNamespace, why: str) -> str:
    held = ", ".join(old.names[:10]) or "nothing"
    because = f"{why}; " if why else ""
    return f"this cell starts a new remote namespace ({because}the old one held {held})"
