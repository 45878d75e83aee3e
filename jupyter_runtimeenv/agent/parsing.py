"""``ParseRunner``: parsing specs off the loop, in threads of its own, bounded in number and
in time.

Who calls it: ``RuntimeEnvAgent.parse_async`` (the server's handlers, ``get_or_create``).
Parsing reads the files a spec names (requirements and environment files) and hashes
``working_dir``/``py_modules`` trees. Those reads are non-blocking and bounded in bytes
(``spec.files``), but a file system can still hang (a dead network mount), and hashing a
large tree takes time. So:

- parses run in daemon threads of this runner, never in the loop's default executor, which
  the server's other routes and every ``to_thread`` of the agent share: a parse that hangs
  cannot starve them;
- at most ``max_parallel`` parses run at once; more wait for a slot;
- a caller waits at most ``timeout`` seconds (for its slot and its parse), then gets a
  ``SpecError``; the thread is left to finish on its own, holding its slot until it does;
- the threads are daemons: a server's shutdown (and interpreter exit) never waits for a
  parse, where ``asyncio.to_thread``'s workers are joined at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import SpecError

T = TypeVar("T")

DEFAULT_PARSE_TIMEOUT = 120.0
DEFAULT_MAX_PARSES = 4

__all__ = ["DEFAULT_MAX_PARSES", "DEFAULT_PARSE_TIMEOUT", "ParseRunner"]


class ParseRunner:
    """Runs blocking spec work (``parse``) in bounded daemon threads; see the module."""

    def __init__(
        self, max_parallel: int = DEFAULT_MAX_PARSES, timeout: float | None = DEFAULT_PARSE_TIMEOUT
    ) -> None:
        if max_parallel < 1:
            raise ValueError("max_parallel must be at least 1")
        self.max_parallel = max_parallel
        self.timeout = timeout
        self._slots: asyncio.Semaphore | None = None
        self.running = 0

    async def run(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``func(*args, **kwargs)`` in a parse thread; ``SpecError`` past the deadline."""
        call = functools.partial(func, *args, **kwargs)
        try:
            return await asyncio.wait_for(self._run(call), self.timeout)
        except asyncio.TimeoutError:
            raise SpecError(
                "",
                f"parsing this spec took longer than {self.timeout:g} s (reading the files it"
                " names, hashing its directories); a file system that does not answer, or a"
                " directory too large to hash in time",
            ) from None

    async def _run(self, call: Callable[[], T]) -> T:
        if self._slots is None:  # made on the loop that uses it
            self._slots = asyncio.Semaphore(self.max_parallel)
        slots = self._slots
        await slots.acquire()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        context = contextvars.copy_context()

        def finish(outcome: tuple[bool, Any]) -> None:
            # On the loop: the slot is free again whether or not anyone still waits.
            self.running -= 1
            slots.release()
            if future.done():
                return
            ok, value = outcome
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def target() -> None:
            try:
                outcome: tuple[bool, Any] = (True, context.run(call))
            except BaseException as exc:  # handed to the caller, whatever it is
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(finish, outcome)

        thread = threading.Thread(target=target, name="jupyter-runtimeenv-parse", daemon=True)
        try:
            thread.start()
        except BaseException:
            slots.release()
            raise
        self.running += 1
        return await future
