"""The plugin contract.

A plugin owns one field of the spec (``name``; for plugins named by import path in the
spec's ``plugins`` field, the value is the config given there). The agent calls, in order:

1. ``validate(value)`` when the spec is parsed; returns the normalised, JSON-compatible value
   or raises ``SpecError`` (its ``field`` relative to the plugin's field);
2. ``identity(value, spec)`` for the env id (default: the value itself). Plugins whose value
   names local files return a content hash here, so moving a directory keeps the id. It may
   read other fields of ``spec`` (``excludes``, ``config``); it may block (parse runs it);
3. ``uris(value, spec)``: the cached resources this value needs (``[]``: none);
4. ``create(uri, value, build)`` for each URI not yet in the cache, concurrently with the
   other plugins' creates; it fills ``build.target`` and returns the bytes it used;
5. ``modify_context(uris, value, ctx)`` in ascending ``priority``;
6. ``delete(uri, path)`` when the cache evicts a resource (the agent removes ``path`` after).

Any of these may be a plain function instead of a coroutine: the agent runs it in a thread,
never on its event loop, but for two that cannot block: ``uris`` left as the base's (no
resources) and the ``modify_context`` of a plugin that sets ``pure_context`` (it only
computes from its arguments). Override what you need; the defaults do nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from ..context import ContextBuilder

if TYPE_CHECKING:
    from ..spec import RuntimeEnvSpec

T = TypeVar("T")

__all__ = ["BuildContext", "RunResult", "RuntimeEnvPlugin"]


@dataclass(frozen=True)
class RunResult:
    """What ``BuildContext.run`` returns: the exit code and every line the process wrote."""

    returncode: int
    output: Sequence[str]

    @property
    def tail(self) -> list[str]:
        return list(self.output[-30:])


class BuildContext(Protocol):
    """What the agent gives a plugin's ``create``: where to build, how to log and run."""

    #: The env being built, its spec and the resource being created.
    env_id: str
    spec: RuntimeEnvSpec
    uri: str
    #: An empty directory to fill; renamed into the cache when ``create`` returns.
    target: Path
    #: The agent's cache root; plugins keep shared caches (uv's) below ``cache_root / "shared"``.
    cache_root: Path

    def log(self, line: str) -> None:
        """Append a line to the env's log and publish it as an event."""

    def limit(self, kind: Literal["install", "download"]) -> AbstractAsyncContextManager[None]:
        """Hold one of the agent's install or download slots."""

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        check: bool = True,
        what: str = "",
    ) -> RunResult:
        """Run a process, streaming its output line by line into the log.

        The process is killed if the build is cancelled or passes its deadline. With
        ``check`` a non-zero exit raises ``BuildError`` naming ``what`` (default: the
        command) with the output's tail.
        """

    async def to_thread(self, func: Callable[..., T], /, *args: Any) -> T:
        """Run blocking work off the event loop."""

    def resource_path(self, uri: str) -> Path:
        """Where the cache keeps (or will keep) the resource ``uri``."""


class RuntimeEnvPlugin:
    """Base class for plugins; see the module docstring for the order of calls."""

    #: The spec field this plugin owns (for import-path plugins: a display name).
    name: ClassVar[str] = ""
    #: Other spec fields accepted as this one (the ``pip`` plugin accepts Ray's ``uv``).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Fields that cannot be given together with this one (``pip`` with ``conda``).
    conflicts: ClassVar[tuple[str, ...]] = ()
    #: Order of ``modify_context``: lower first; later plugins see and may override earlier.
    priority: ClassVar[int] = 50
    #: One line for error messages and ``jupyter runtimeenv plugins``.
    description: ClassVar[str] = ""
    #: Whether ``identity`` reads local files that may change under the same value (a
    #: directory): executors then ask again at every call (``spec.refresh``), so the
    #: call after an edit gets an env with the edit. ``identity`` must be cheap when
    #: nothing changed (``working_dir`` and ``py_modules``: a stat walk).
    local_content: ClassVar[bool] = False
    #: Whether ``modify_context`` (a plain function) only computes from its arguments: no
    #: I/O, nothing that can block. The agent then calls it on its loop instead of in a
    #: thread (a hop there and back was 0.1-0.5 ms of a new env's build, per plugin).
    pure_context: ClassVar[bool] = False

    def validate(self, value: Any) -> Any:
        return value

    def is_empty(self, value: Any) -> bool:
        """Whether the normalised ``value`` asks for nothing. As in Ray, such a field is left
        out of the spec (``{"pip": []}`` and ``{"env_vars": {}}`` are the env of ``{}``)."""
        return isinstance(value, (list, dict)) and not value

    def identity(self, value: Any, spec: RuntimeEnvSpec) -> Any:
        return value

    def refresh_identity(self, value: Any, spec: RuntimeEnvSpec, known: Any) -> Any:
        """The identity of ``value`` now (``known``: the one ``spec`` was made with); asked
        at every call when ``local_content`` is set. Blocking, must be cheap when nothing
        changed; may return ``known`` for parts that cannot change locally (a URL)."""
        return self.identity(value, spec)

    def uris(self, value: Any, spec: RuntimeEnvSpec) -> list[str]:
        return []

    def describe(self, uri: str, value: Any, spec: RuntimeEnvSpec) -> str:
        """What a user reads for the step that creates ``uri``, e.g. ``pip: greeting==1.0``:
        what it installs or holds, not its hash. Called on the agent's loop: must not block
        (no I/O beyond what ``uris`` already cached)."""
        return f"{self.name}: {uri.split(':', 1)[-1][:16]}"

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        return 0

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        return None

    async def delete(self, uri: str, path: Path) -> None:
        return None


async def call_maybe_sync(
    func: Callable[..., Any],
    *args: Any,
    to_thread: Callable[..., Awaitable[Any]],
    inline: bool = False,
) -> Any:
    """Await ``func(*args)`` if it is a coroutine function, else run it in a thread (or,
    ``inline``, here: for what cannot block, see ``runs_inline``)."""
    import inspect

    if inspect.iscoroutinefunction(func):
        return await func(*args)
    if inline:
        return func(*args)
    return await to_thread(func, *args)


def runs_inline(plugin: RuntimeEnvPlugin, method: Literal["uris", "modify_context"]) -> bool:
    """Whether the agent may call ``plugin``'s plain ``method`` on its loop: ``uris`` left as
    the base's (it returns ``[]``), or ``modify_context`` of a ``pure_context`` plugin."""
    if method == "uris":
        return getattr(type(plugin), "uris", None) is RuntimeEnvPlugin.uris
    return plugin.pure_context
