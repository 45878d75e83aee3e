"""The kernel's declared environments as the agent sees them: ``declared_envs()``.

Who calls it: ``%runtime_env --list`` and whoever reports the kernel's environments
elsewhere. The declarations themselves live in the session (``jupyter_runtimeenv.session``:
``declare``, ``forget``, ``lookup``); this module adds what only the workers' side knows,
the env id each one is built under from this driver.
"""

from __future__ import annotations

from typing import Any

from .. import session
from ..spec import RuntimeEnvSpec
from .cluster import ClusterExecutor
from .executor import resolve_for_driver

__all__ = ["declared_envs"]


def declared_envs() -> list[dict[str, Any]]:
    """The kernel's declared environments, JSON-compatible: the default first (``name``
    ``None``, present only when set), then the named ones by name.

    Each is ``{"name", "env_id", "spec"}``: ``spec`` is the spec as declared (its canonical
    JSON) and ``env_id`` the id the agent builds it under from this driver (the spec with the
    driver's ``sys.path`` and interpreter filled in, as a task submitted now would send it);
    on a cluster (the session's executor runs on nodes), the id its nodes build it under.
    """
    executor = session.executor()
    env_id = (
        executor.env_id_of
        if isinstance(executor, ClusterExecutor)
        else lambda spec: resolve_for_driver(spec).env_id
    )
    entries: list[tuple[str | None, RuntimeEnvSpec]] = []
    default = session.default_runtime_env()
    if default is not None:
        entries.append((None, default))
    entries.extend(session.named_envs())
    return [
        {"name": name, "env_id": env_id(spec), "spec": spec.to_json()} for name, spec in entries
    ]
