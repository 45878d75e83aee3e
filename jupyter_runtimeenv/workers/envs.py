"""Named environments of this driver (the kernel): ``%runtime_env --name NAME`` declares one,
``@remote(runtime_env="NAME")``, ``.options(runtime_env="NAME")`` and ``%%remote --env NAME``
use it.

Who calls it: the ``%runtime_env`` magic (``declare``, ``forget``), ``RemoteFunction``
(``lookup``, at each ``.remote()`` so a redeclared env takes effect), and whoever reports the
kernel's environments elsewhere (``declared_envs``: the default and the named ones, as
JSON-compatible dicts). A named env stands alone: it is not merged over the session default.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from ..errors import SpecError
from ..spec import RuntimeEnvSpec

__all__ = ["declare", "declared_envs", "forget", "lookup", "names"]

#: What a name may look like: a word, as in a Python identifier, plus ``-`` and ``.``.
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")

_lock = threading.Lock()
_named: dict[str, RuntimeEnvSpec] = {}
#: Bumped at every change, so callers can memoise what they derived from the registry.
generation = 0


def check_name(name: str) -> str:
    """``name`` if it is a valid env name, else ``SpecError`` naming it."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise SpecError(
            "name", f"{name!r} is not a valid env name (a letter or _, then letters, digits, _.-)"
        )
    return name


def declare(name: str, spec: RuntimeEnvSpec) -> None:
    """Declare (or replace) the env ``name``."""
    global generation
    check_name(name)
    with _lock:
        _named[name] = spec
        generation += 1


def forget(name: str) -> bool:
    """Drop the env ``name``; ``False`` if there was none."""
    global generation
    with _lock:
        generation += 1
        return _named.pop(name, None) is not None


def lookup(name: str) -> RuntimeEnvSpec:
    """The spec declared as ``name``; ``SpecError`` (field ``runtime_env``) naming the
    declared ones otherwise."""
    with _lock:
        spec = _named.get(name)
        known = sorted(_named)
    if spec is None:
        declared = ", ".join(known) if known else "none yet; use %runtime_env --name NAME ..."
        raise SpecError("runtime_env", f"no environment named {name!r} (declared: {declared})")
    return spec


def names() -> list[str]:
    with _lock:
        return sorted(_named)


def clear() -> None:
    """Forget every named env (``shutdown``)."""
    global generation
    with _lock:
        _named.clear()
        generation += 1


def declared_envs() -> list[dict[str, Any]]:
    """The kernel's declared environments, JSON-compatible: the default first (``name``
    ``None``, present only when set), then the named ones by name.

    Each is ``{"name", "env_id", "spec"}``: ``spec`` is the spec as declared (its canonical
    JSON) and ``env_id`` the id the agent builds it under from this driver (the spec with the
    driver's ``sys.path`` and interpreter filled in, as a task submitted now would send it).
    """
    from . import api
    from .executor import resolve_for_driver

    with _lock:
        named = sorted(_named.items())
    entries: list[tuple[str | None, RuntimeEnvSpec]] = []
    default = api.default_runtime_env()
    if default is not None:
        entries.append((None, default))
    entries.extend(named)
    return [
        {"name": name, "env_id": resolve_for_driver(spec).env_id, "spec": spec.to_json()}
        for name, spec in entries
    ]
