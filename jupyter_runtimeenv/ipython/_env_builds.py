"""How ``%runtime_env`` builds and lists envs: in a widget, as text, or on a cluster.

Who calls it: ``RuntimeEnvMagics`` (``magics.py``). What it owns: the session's cluster
executor when there is one (``cluster``: builds and ``--list`` go to every node through
``cluster_build.py``), a build shown in a ``BuildStatusWidget`` (``build_in_widget``,
``show_widget``), the message of a failed build and its "View log" link (``build_failed``,
``offer_log``), and the agent's states for ``--list`` (``agent_states``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from typing import Any

from IPython.core.error import UsageError

from .. import session
from ..errors import BuildError, RuntimeEnvError, SpecError
from ..spec import RuntimeEnvSpec
from ..workers.cluster import ClusterExecutor
from ._env_specs import first_line


def session_cluster() -> ClusterExecutor | None:
    """The session's executor when it runs on nodes (a Dask executor), else ``None``."""
    executor = session.executor()
    return executor if isinstance(executor, ClusterExecutor) else None


def build_on_every_node(
    cluster: ClusterExecutor,
    spec: RuntimeEnvSpec,
    name: str | None,
    *,
    widget: bool,
    background: bool,
) -> None:
    """``%runtime_env``'s build on every node of ``cluster`` (``cluster_build.py``); its
    errors as the magic's one-line ``UsageError``."""
    from .cluster_build import build_on_cluster

    try:
        build_on_cluster(cluster, spec, name, widget=widget, background=background)
    except SpecError as exc:
        raise UsageError(f"runtime_env: invalid spec: {first_line(exc)}") from None
    except RuntimeEnvError as exc:  # no node up, the scheduler gone ...
        raise UsageError(f"runtime_env: {first_line(exc)}") from None


def cluster_listing(cluster: ClusterExecutor, declared: list[dict[str, Any]]) -> str:
    """``--list`` on a cluster: each env's state on the nodes."""
    from .cluster_build import cluster_states

    specs: dict[str | None, RuntimeEnvSpec] = dict(session.named_envs())
    default = session.default_runtime_env()
    if default is not None:
        specs[None] = default
    rows = [("NAME", "ENV ID", "STATE ON THE CLUSTER")]
    for entry in declared:
        spec = specs.get(entry["name"])
        state = cluster_states(cluster, spec) if spec is not None else "?"
        rows.append((entry["name"] or "(default)", entry["env_id"][:12], state))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:<12}  {c}" for a, b, c in rows)


def offer_log(exc: BuildError) -> None:
    """A "View log" link above a failed build's error, for a build of the server's agent: the
    JupyterLab extension opens the whole log in a tab (``runtimeenv:view-log``); elsewhere the
    text form names the log's path."""
    import html
    import json

    import IPython.display

    display: Any = IPython.display.display  # untyped
    if not exc.env_id:
        return
    args = html.escape(json.dumps({"env_id": exc.env_id}), quote=True)
    where = f" at {html.escape(exc.where)}" if exc.where else ""
    link = (
        f'<a href="#" data-commandlinker-command="runtimeenv:view-log"'
        f' data-commandlinker-args="{args}" title="Open the whole build log"'
        ' style="color:var(--jp-content-link-color, #1976d2)">View log</a>'
    )
    text = f"the build of {exc.env_id[:12]} failed{where}"
    display(
        {
            "text/html": f"<span>{html.escape(text)} &middot; {link}</span>",
            "text/plain": f"{text}; the whole log: {exc.log_path}" if exc.log_path else text,
        },
        raw=True,
    )


def build_failed(exc: BuildError, name: str | None, *, with_tail: bool) -> str:
    """The ``UsageError`` of a failed build: the whole error when nothing showed its output,
    else one line (the widget or the streamed lines told the message already)."""
    from .progress import kept

    if with_tail:
        return f"runtime_env: build failed ({kept(name)}): {exc}"
    where = f" at {exc.where}" if exc.where else ""
    log = f"; the whole log: {exc.log_reference}" if exc.log_path else ""
    return f"runtime_env: build failed{where}: {kept(name)}{log}"


def agent_states() -> dict[str, str]:
    """env id -> state, from the agent (empty if it cannot be asked)."""
    from ..client import get_client

    client = get_client()
    found: list[dict[str, Any]] = []

    def ask() -> None:
        with contextlib.suppress(RuntimeEnvError, OSError):
            found.extend(asyncio.run(client.status()))

    thread = threading.Thread(target=ask, name="runtime-env-status", daemon=True)
    thread.start()
    thread.join(30)
    return {str(e.get("env_id")): str(e.get("state")) for e in found}


def show_widget(env_id: str) -> tuple[Any, Any]:
    import IPython.display

    from ..client import EmbeddedClient, get_client
    from .static import METADATA_KEY
    from .widget import BuildStatusWidget

    widget = BuildStatusWidget(env_id)
    # The server's agent builds it: the JupyterLab extension can open its log.
    widget.view_log = not isinstance(get_client(), EmbeddedClient)
    display: Any = IPython.display.display  # untyped
    # The env it builds, for the JupyterLab extension: a widget still live when its kernel
    # restarts or dies never gets its static form, and the extension replaces it by a line
    # with the env's state in the server (``labextension/src/outputs.ts``).
    metadata = {METADATA_KEY: {"build": env_id}}
    return widget, display(widget, display_id=True, metadata=metadata)


def build_in_widget(spec: RuntimeEnvSpec, holder: str, name: str | None = None) -> Any:
    """``build_now`` shown in a ``BuildStatusWidget``, displayed now and replaced at the end by
    its static form (text/html and text/plain: what text-only frontends and saved notebooks
    show)."""
    from ..client import get_client
    from .progress import build_now

    widget, handle = show_widget(spec.env_id)
    try:
        return build_now(spec, get_client(), holder, sys.stdout, widget, name=name)
    finally:
        widget.finalize(handle)
