"""A notebook cell reads the newest value of a name, wherever a cell last changed it.

A ``%%remote`` cell reads the notebook's variables (``_remote_namespaces``: they are sent
unless a remote cell changed them last); this is the other half. Before a notebook's own cell
runs, the names it reads (as ``_remote_code`` finds a remote cell's) that a remote cell
changed last and the notebook has not bound since are brought back from the remote namespace
that holds them (an empty cell with ``--out`` those names, in that namespace's worker), so the
cell sees what it would have seen had every cell run in the kernel: ``x = f(x)`` in a remote
cell, then ``print(x)`` in a notebook cell prints the new ``x``, and a name only a remote cell
defined is there. Once brought back a name is the same on both sides and is not fetched again
until a remote cell changes it again.

A value the kernel cannot unpickle (its package is not installed here, or another version)
stays where it is, said in one line with its cause; the cell then runs with what the notebook
has (IPython's ``NameError`` and ``_remote_namespaces``' line if it has nothing). Nothing is
fetched on an executor that keeps no namespace between cells (Dask).

Who calls it: IPython's ``pre_run_cell`` event (registered by ``remote_cell``).
"""

from __future__ import annotations

import secrets
import sys
from typing import Any

from .. import api
from . import _cell_runner
from ._remote_code import local_reads
from ._remote_namespaces import RemoteNamespace, namespaces
from ._remote_stream import cell_streams, figure_settings, take_style
from ._remote_values import load_all

__all__ = ["bring_back"]


def bring_back(info: Any) -> None:
    """IPython's ``pre_run_cell``: fetch the remote values the notebook's cell will read."""
    raw = getattr(info, "raw_cell", None) or ""
    take_style(None)  # a remote cell's style, kept until the kernel imported matplotlib
    spaces = namespaces()
    if not raw or raw.lstrip().startswith("%%remote") or not any(s.stale for s in spaces):
        return
    from IPython import get_ipython

    shell: Any = get_ipython()
    if shell is None:
        return
    executor = api._executor()
    if not getattr(executor, "keeps_affinity", False):
        return
    try:
        body = shell.transform_cell(raw)
    except Exception:  # IPython shows the cell's own error when it runs it
        return
    user_ns: dict[str, Any] = shell.user_ns
    wanted: dict[str, RemoteNamespace] = {}
    for name in local_reads(body):
        holders = [s for s in spaces if s.newer_here(name, user_ns) and s.spec is not None]
        held = [s for s in holders if s.owner is not None and s.owner() is executor]
        if held:
            wanted[name] = max(held, key=lambda s: s.tick)  # the newest binding wins
    by_key = {space.key: space for space in wanted.values()}
    for key, space in by_key.items():
        _fetch(shell, executor, space, [n for n, s in wanted.items() if s.key == key])


def _fetch(shell: Any, executor: Any, space: RemoteNamespace, names: list[str]) -> None:
    nonce = secrets.token_hex(8)
    request = {
        "source": "\n",
        "lines": "\n",
        "filename": "<%%remote values>",
        "inputs": {},
        "outputs": names,
        "nonce": nonce,
        "figures": figure_settings(shell),
        "quiet": True,
        "namespace": {"key": space.key, "expected": space.expected()},
    }
    task = _cell_runner.run_cell.__name__
    try:
        with cell_streams(nonce, task) as (out, err):
            future = executor.submit(
                _cell_runner.run_cell,
                (request,),
                {},
                runtime_env=space.spec,
                name=task,
                affinity=space.key,
            )
        try:
            result: dict[str, Any] = future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise
        finally:
            out.finish()
            err.finish()
    except Exception as exc:
        _say(f"could not bring back {_listed(names)} from {space.label}: {exc}")
        return
    if result.get("lost"):
        _say(f"the worker of {space.label} is gone: {space.lost(keep_key=True)}")
        return
    if result["error"] is not None:
        _say(f"could not bring back {_listed(names)}: {result['error'].get('message')}")
        return
    # Names gone from the namespace (``del``) are not in it: the notebook's values stand.
    values, unloadable = load_all(result["outputs"])
    for name, why in unloadable.items():
        _say(
            f"{name!r} was changed last by a %%remote cell of {space.label}, and cannot be"
            f" brought back into the notebook: {why} (use it in a %%remote cell)"
        )
    shell.push(values)
    space.after_cell(result["namespace"], [], shell.user_ns, values)


def _listed(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _say(text: str) -> None:
    print(f"%%remote: {text}", file=sys.stderr)
