"""How driver-side code (a kernel, a script) reaches an agent.

``get_client()`` returns the process-wide client: the Jupyter server's agent over REST when
the server exported ``JUPYTER_RUNTIMEENV_URL`` and ``JUPYTER_RUNTIMEENV_TOKEN`` to this
kernel, otherwise an agent embedded in this process. The embedded agent runs on its own
event loop in a daemon thread, so the same calls work from a kernel whose loop is already
running (no nest_asyncio), from scripts and from other threads. Every async method has a
``_sync`` twin.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from .context import EnvContext
from .spec import RuntimeEnvSpec

if TYPE_CHECKING:
    # Imported where an embedded agent is made: a kernel of a server never needs it.
    from .agent import RuntimeEnvAgent

T = TypeVar("T")

URL_ENV_VAR = "JUPYTER_RUNTIMEENV_URL"
TOKEN_ENV_VAR = "JUPYTER_RUNTIMEENV_TOKEN"

SpecLike = RuntimeEnvSpec | Mapping[str, Any]


@runtime_checkable
class AgentClient(Protocol):
    """What drivers need from an agent, wherever it runs."""

    async def acquire(self, spec: SpecLike, holder: str, *, retry: bool = False) -> EnvContext:
        """Build ``spec`` if needed, take a reference for ``holder``, return its context."""

    async def release(self, env_id: str, holder: str) -> None:
        """Drop ``holder``'s reference."""

    async def status(self) -> list[dict[str, Any]]:
        """Every env the agent knows."""

    async def log(self, env_id: str) -> str:
        """An env's build log."""

    def acquire_sync(self, spec: SpecLike, holder: str, *, retry: bool = False) -> EnvContext: ...

    def release_sync(self, env_id: str, holder: str) -> None: ...

    def close(self) -> None: ...


class LoopThread:
    """An event loop running in a daemon thread; ``run`` submits coroutines to it."""

    def __init__(self, name: str = "jupyter-runtimeenv") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("cannot wait for the loop thread from inside it")
        return self.submit(coro).result(timeout)

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the loop thread from any other running loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class EmbeddedClient:
    """An agent in this process, on its own loop thread, sharing the on-disk cache."""

    def __init__(self, agent: RuntimeEnvAgent | None = None) -> None:
        if agent is None:
            from .agent import RuntimeEnvAgent

            agent = RuntimeEnvAgent()
        self._thread = LoopThread("jupyter-runtimeenv-agent")
        self.agent = agent
        self._thread.run(self.agent.start())
        self._closed = False

    async def acquire(self, spec: SpecLike, holder: str, *, retry: bool = False) -> EnvContext:
        return await self._thread.run_async(self.agent.get_or_create(spec, holder, retry=retry))

    async def release(self, env_id: str, holder: str) -> None:
        if self._closed:
            return  # stopping the agent dropped every reference this process held
        await self._thread.run_async(self.agent.release(env_id, holder))

    async def status(self) -> list[dict[str, Any]]:
        return await self._thread.run_async(self.agent.status())

    async def log(self, env_id: str) -> str:
        return await self._thread.run_async(self.agent.log(env_id))

    def acquire_sync(self, spec: SpecLike, holder: str, *, retry: bool = False) -> EnvContext:
        return self._thread.run(self.agent.get_or_create(spec, holder, retry=retry))

    def release_sync(self, env_id: str, holder: str) -> None:
        if self._closed:
            return  # stopping the agent dropped every reference this process held
        self._thread.run(self.agent.release(env_id, holder))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self.agent.stop(), timeout=30)
        finally:
            self._thread.stop()


_client: AgentClient | None = None
_client_lock = threading.Lock()


def get_client() -> AgentClient:
    """The process-wide client: the server's agent if this kernel was started by a Jupyter
    server with the extension, else an embedded agent (created on first use)."""
    global _client
    with _client_lock:
        if _client is None:
            url = os.environ.get(URL_ENV_VAR)
            if url:
                from .server.client import ServerClient

                _client = ServerClient(url, os.environ.get(TOKEN_ENV_VAR, ""))
            else:
                _client = EmbeddedClient()
            _at_exit(_close_client)
        return _client


def set_client(client: AgentClient | None) -> AgentClient | None:
    """Replace the process-wide client (tests, or an app with its own agent); returns the old."""
    global _client
    with _client_lock:
        old, _client = _client, client
    return old


def _at_exit(func: Callable[[], None]) -> None:
    """Run ``func`` at interpreter exit while thread pools still accept work.

    ``atexit`` handlers run after ``concurrent.futures`` has shut its executors down, and
    the agent's stop needs ``asyncio.to_thread``. ``threading._register_atexit`` (what
    ``concurrent.futures`` itself uses) runs hooks in reverse order of registration, so a
    hook registered now runs before the executors close. Fall back to ``atexit``.
    """
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError
        register(func)
    except RuntimeError:
        atexit.register(func)


def _close_client() -> None:
    client = set_client(None)
    if client is not None:
        client.close()
