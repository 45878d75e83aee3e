"""``EnvContext``: the immutable result of building an environment.

Plugins fill a mutable ``ContextBuilder`` in priority order; the agent freezes it into an
``EnvContext``, which round-trips through JSON so that the server can hand it to a kernel.
``compose`` turns a context and an argv into the argv to start: a list, never a shell string.

``env_vars`` values are templates: ``${NAME}`` in them stands for ``NAME`` in the environment
of the process that starts the worker (a kernel, a Dask node, the server for a kernel it
starts), and is expanded there by ``process_env``, each time, as Ray does per worker. The
agent never expands them, so a context (stored in the cache, served over REST) never holds a
value of the agent's environment.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: The variable through which a worker (or a kernel's bootstrap) receives the ``sys.path``
#: entries to put first: a JSON list, ``extra_paths`` then ``driver_sys_path``.
SYS_PATH_VAR = "JUPYTER_RUNTIMEENV_SYS_PATH"
#: The variable that tells a process which environment it runs in.
ENV_ID_VAR = "JUPYTER_RUNTIMEENV_ENV_ID"
#: The form of a context's JSON. 2: ``env_vars`` hold ``${NAME}`` templates (before, the
#: agent expanded them in its own environment: a stored context of form 1 is rebuilt).
#: 3: ``spawn_only``.
CONTEXT_FORMAT = 3
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class EnvContext:
    """How to start a process inside an environment.

    ``python`` is the interpreter; ``command_prefix`` goes before it (e.g. ``["nice", "-n",
    "10"]``); ``env_vars`` are set on top of the parent's environment; ``cwd`` is the working
    directory (``None``: the caller's); ``extra_paths`` (working_dir, py_modules) and then
    ``driver_sys_path`` go first on ``sys.path``, in that order. ``spawn_only``: workers start
    as a fresh interpreter, never forked from a template (``workers.zygote``): how they start
    is the user's choice (``py_executable``).
    """

    python: str = sys.executable
    command_prefix: tuple[str, ...] = ()
    env_vars: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cwd: str | None = None
    driver_sys_path: tuple[str, ...] = ()
    extra_paths: tuple[str, ...] = ()
    env_id: str = ""
    spawn_only: bool = False

    def __post_init__(self) -> None:
        # Normalise containers so that equal contexts compare and hash equal.
        object.__setattr__(self, "command_prefix", tuple(self.command_prefix))
        object.__setattr__(self, "driver_sys_path", tuple(self.driver_sys_path))
        object.__setattr__(self, "extra_paths", tuple(self.extra_paths))
        object.__setattr__(self, "env_vars", MappingProxyType(dict(sorted(self.env_vars.items()))))

    def __hash__(self) -> int:
        return hash(self.to_json_str())

    @property
    def sys_path(self) -> tuple[str, ...]:
        """The entries a process started in this context puts first on ``sys.path``."""
        return self.extra_paths + self.driver_sys_path

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CONTEXT_FORMAT,
            "env_id": self.env_id,
            "python": self.python,
            "command_prefix": list(self.command_prefix),
            "env_vars": dict(self.env_vars),
            "cwd": self.cwd,
            "driver_sys_path": list(self.driver_sys_path),
            "extra_paths": list(self.extra_paths),
            "spawn_only": self.spawn_only,
        }

    def to_json_str(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EnvContext:
        return cls(
            python=str(data["python"]),
            command_prefix=tuple(data.get("command_prefix", ())),
            env_vars=dict(data.get("env_vars", {})),
            cwd=data.get("cwd"),
            driver_sys_path=tuple(data.get("driver_sys_path", ())),
            extra_paths=tuple(data.get("extra_paths", ())),
            env_id=str(data.get("env_id", "")),
            spawn_only=bool(data.get("spawn_only", False)),
        )

    def replace(self, **changes: Any) -> EnvContext:
        data = self.to_json()
        data.update(changes)
        return EnvContext.from_json(data)


@dataclass
class ContextBuilder:
    """The mutable context plugins change in ``modify_context``; frozen by ``freeze``."""

    python: str = sys.executable
    command_prefix: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    driver_sys_path: list[str] = field(default_factory=list)
    extra_paths: list[str] = field(default_factory=list)
    #: URI -> the directory the cache holds for it; set by the agent before plugins run.
    resource_paths: dict[str, str] = field(default_factory=dict)
    #: Set by a plugin whose workers must start exactly as it says (see ``EnvContext``).
    spawn_only: bool = False

    def resource_path(self, uri: str) -> str:
        """The directory that holds the built resource ``uri``."""
        return self.resource_paths[uri]

    def freeze(self, env_id: str = "") -> EnvContext:
        return EnvContext(
            python=self.python,
            command_prefix=tuple(self.command_prefix),
            env_vars=dict(self.env_vars),
            cwd=self.cwd,
            driver_sys_path=tuple(self.driver_sys_path),
            extra_paths=tuple(self.extra_paths),
            env_id=env_id,
            spawn_only=self.spawn_only,
        )


def compose(ctx: EnvContext, argv: Sequence[str]) -> list[str]:
    """The argv that starts ``python argv...`` inside ``ctx``: prefix, interpreter, args.

    Feed it to ``asyncio.create_subprocess_exec`` or ``subprocess.Popen`` together with
    ``env=process_env(ctx)`` and ``cwd=ctx.cwd``.
    """
    return [*ctx.command_prefix, ctx.python, *argv]


def process_env(ctx: EnvContext, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables of a process started in ``ctx``, made in the process that
    starts it.

    ``base`` (default ``os.environ``) with the context's variables on top, each template's
    ``${NAME}`` expanded against ``base`` (see ``expand``), the sys.path entries in
    ``SYS_PATH_VAR`` and the env id in ``JUPYTER_RUNTIMEENV_ENV_ID``.
    """
    env = dict(os.environ if base is None else base)
    before = dict(env)
    for key, value in ctx.env_vars.items():
        env[key] = expand(value, before)
    env[SYS_PATH_VAR] = json.dumps(list(ctx.sys_path))
    if ctx.env_id:
        env[ENV_ID_VAR] = ctx.env_id
    return env


def expand(template: str, environ: Mapping[str, str]) -> str:
    """``template`` with each ``${NAME}`` replaced by ``environ[NAME]``: '' when unset (as
    in Ray), except ``PATH``, which is ``os.defpath`` then (what a command search uses), so
    that ``dir:${PATH}`` never ends in an empty entry (the current directory)."""
    if "${" not in template:
        return template

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        found = environ.get(name)
        if found is None:
            return os.defpath if name == "PATH" else ""
        return found

    return _REFERENCE.sub(value, template)


def compose_template(template: str, earlier: Mapping[str, str]) -> str:
    """``template`` with each ``${NAME}`` that ``earlier`` (the variables the env set before:
    other plugins', earlier keys) holds replaced by *that template*, the others kept: what
    ``${NAME}`` means when ``process_env`` expands it (``PATH: /opt/bin:${PATH}`` in a pip env
    prepends to the venv's ``PATH``, itself ``<venv>/bin:${PATH}``). Text only: the agent
    never reads its own environment for it."""
    if "${" not in template:
        return template

    def value(match: re.Match[str]) -> str:
        return earlier.get(match.group(1), match.group(0))

    return _REFERENCE.sub(value, template)
