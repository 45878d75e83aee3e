"""The REST API under ``{base_url}jupyter-runtimeenv/api/`` (described in ``openapi.yaml``).

Every method is ``authenticated`` and ``authorized`` on the resource ``jupyter_runtimeenv``
(GET is ``read``; POST and DELETE are ``write``). A request is data from an untrusted sender
(see ``spec.policy``), and the server answers any request with valid JSON and a 4xx rather
than a 500:

- bodies are read as a stream and refused with 413 past ``max_spec_bytes`` (an announced
  ``Content-Length`` is refused before the body is read);
- JSON is decoded strictly: ``NaN``, ``Infinity``, numbers out of range and nesting past the
  recursion limit are a 400; responses are encoded with ``allow_nan=False``;
- every env id in a path is checked against the env-id alphabet (hex, or an unambiguous hex
  prefix) and every holder name against its own before anything is looked up: 404 otherwise;
- decoding, parsing (which may hash files) and encoding large bodies run in threads; the
  server's loop never blocks, and no request's work grows with the stored envs.

The handlers know the extension only as an ``AgentHost``; ``app.py`` depends on this module,
never the other way round.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable
from typing import Any, Protocol

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web

from .._version import __version__
from ..agent import RuntimeEnvAgent
from ..errors import BuildError, CacheUnavailable, EnvInUse, EnvNotFound, InvalidName, SpecError
from ..spec.ids import check_holder
from ..spec.strict_json import dumps_strict, loads_strict

AUTH_RESOURCE = "jupyter_runtimeenv"
API_PREFIX = "/jupyter-runtimeenv/api"
SETTINGS_KEY = "jupyter_runtimeenv"

DEFAULT_HOLDER = "user"
#: Bodies of requests that carry no spec (``gc``) are small.
SMALL_BODY_BYTES = 64 * 1024
#: ``GET envs`` answers pages of summaries.
DEFAULT_PAGE = 500
MAX_PAGE = 5000
#: Responses larger than this are encoded in a thread.
_INLINE_JSON = 64 * 1024
_ENV_ID = r"(?P<env_id>[^/]+)"
_DIGITS = re.compile(r"[0-9]{1,9}")
#: A POST whose env is removed under it (a concurrent DELETE or rebuild) asks this often.
_ENSURE_ATTEMPTS = 5


class AgentHost(Protocol):
    """What the handlers need from the extension that hosts the agent (``settings`` key
    ``jupyter_runtimeenv``)."""

    @property
    def max_spec_bytes(self) -> int: ...

    @property
    def agent_started(self) -> bool: ...

    async def started_agent(self) -> RuntimeEnvAgent: ...

    def state_counts(self) -> dict[str, int]: ...

    def note_holder(self, holder: str) -> None: ...


class _Done(Exception):
    """A response was already written."""


@web.stream_request_body
class RuntimeEnvHandler(APIHandler):
    """Base of the handlers: the host, the agent, bounded bodies, JSON in and out."""

    auth_resource = AUTH_RESOURCE
    #: Methods whose body may be a spec (up to ``max_spec_bytes``); others get SMALL_BODY_BYTES.
    spec_methods: frozenset[str] = frozenset()

    @property
    def host(self) -> AgentHost:
        host: AgentHost = self.settings[SETTINGS_KEY]
        return host

    def body_limit(self) -> int:
        if self.request.method in self.spec_methods:
            return int(self.host.max_spec_bytes)
        return SMALL_BODY_BYTES

    async def prepare(self) -> None:  # type: ignore[override]
        self._chunks: list[bytes] = []
        self._received = 0
        self._too_large = False
        await super().prepare()
        if self._finished:
            return
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > self.body_limit():
            # Answered before the body is read; the body is then read and dropped.
            self._too_large = True
            self.fail(413, "RequestTooLarge", self._too_large_message())

    def decode_argument(self, value: bytes, name: str | None = None) -> str:
        # Not tornado's 400 for bytes that are not UTF-8: such an id or holder is simply not
        # in its alphabet, and gets the same 404 as every other one.
        return value.decode("utf-8", errors="replace")

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._too_large or self._received > self.body_limit():
            self._too_large = True
            self._chunks.clear()  # kept no further: memory stays bounded
            return
        self._chunks.append(chunk)

    def _too_large_message(self) -> str:
        limit = self.body_limit()
        what = "a spec" if self.request.method in self.spec_methods else "this request's body"
        return f"{what} may be at most {limit} bytes (RuntimeEnvExtension.max_spec_bytes)"

    async def agent(self) -> RuntimeEnvAgent:
        try:
            return await self.host.started_agent()
        except RuntimeError as exc:  # the server is stopping
            raise web.HTTPError(503, str(exc)) from exc
        except CacheUnavailable as exc:  # full or read-only disk: logged by the extension
            self.fail(503, "CacheUnavailable", str(exc), path=exc.path, cause=exc.cause)
            raise _Done from None

    def holder(self) -> str:
        # A server serves one user, and token-authenticated requests get a fresh anonymous
        # username each time (jupyter_server's default identity provider): the default holder
        # is therefore one name, not the username.
        holder = self.query("holder") or DEFAULT_HOLDER
        try:
            return check_holder(holder)
        except InvalidName as exc:
            self.fail(400, "InvalidName", str(exc), field="holder")
            raise _Done from None

    def query(self, name: str) -> str:
        """The query argument ``name`` as sent (``""`` if absent). Not ``get_query_argument``:
        it turns control characters into spaces and strips them, so ``%00`` or ``a%0A`` would
        silently become another value instead of being refused."""
        given = self.request.query_arguments.get(name) or [b""]
        return self.decode_argument(given[-1])

    def flag(self, name: str) -> bool:
        return self.query(name).lower() in ("1", "true", "yes")

    def count(self, name: str, default: int, maximum: int) -> int:
        text = self.query(name)
        if not text:
            return default
        if _DIGITS.fullmatch(text) is None or int(text) > maximum:
            self.fail(400, "ValueError", f"{name}: expected an integer from 0 to {maximum}")
            raise _Done
        return int(text)

    async def json_body(self, *, required: bool = True) -> Any:
        if self._too_large:
            self.fail(413, "RequestTooLarge", self._too_large_message())
            raise _Done
        body = b"".join(self._chunks)
        self._chunks = []
        if not body and not required:
            return None
        try:
            if len(body) > _INLINE_JSON:
                return await asyncio.to_thread(loads_strict, body)
            return loads_strict(body)
        except ValueError as exc:
            self.fail(400, "SpecError", f"the body is not valid JSON: {exc}", field="")
            raise _Done from None

    def fail(self, status: int, kind: str, message: str, **extra: Any) -> None:
        self.set_status(status)
        self.finish(dumps_strict({"type": kind, "message": message, **extra}))

    async def reply(self, data: Any) -> None:
        """Finish with ``data`` as strict JSON; encoded in a thread when it may be large (a
        spec, a list of envs: not ``GET status``'s counts, whose hop to a thread and back
        was most of its time on the loop with 16 busy kernels, ``bench_scaling.py``)."""
        big = isinstance(data, dict) and ("spec" in data or isinstance(data.get("envs"), list))
        text = await asyncio.to_thread(dumps_strict, data) if big else dumps_strict(data)
        self.finish(text)

    async def run(self, coro: Awaitable[Any]) -> Any:
        """Await ``coro`` turning our errors into responses (``_Done`` when one was sent)."""
        try:
            return await coro
        except SpecError as exc:
            self.fail(400, type(exc).__name__, str(exc), field=exc.field, reason=exc.reason)
        except EnvNotFound as exc:
            self.fail(404, "EnvNotFound", str(exc))
        except EnvInUse as exc:
            self.fail(409, "EnvInUse", str(exc))
        raise _Done

    async def env_id(self, agent: RuntimeEnvAgent, text: str) -> str:
        """The whole env id ``text`` names (an id or unambiguous prefix); 404 otherwise."""
        resolved: str = await self.run(agent.resolve_id(text))
        return resolved


def _handles_done(method: Any) -> Any:
    # Innermost decorator: a response written by ``fail`` ends the request quietly.
    async def inner(self: RuntimeEnvHandler, *args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(_Done):
            if self._too_large:  # a streamed body passed the limit (no Content-Length)
                self.fail(413, "RequestTooLarge", self._too_large_message())
                return
            try:
                await method(self, *args, **kwargs)
            except CacheUnavailable as exc:
                # The disk filled (or turned read-only) while the server runs: the same
                # documented 503 as a cache that could not be opened, whatever the route.
                self.log.error("jupyter_runtimeenv: %s", exc)
                if not self._finished:
                    self.fail(503, "CacheUnavailable", str(exc), path=exc.path, cause=exc.cause)

    inner.__name__ = method.__name__
    inner.__doc__ = method.__doc__
    return inner


class EnvsHandler(RuntimeEnvHandler):
    spec_methods = frozenset({"POST"})

    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """A page of env summaries (``?limit=``, ``?offset=``), oldest first, and the total."""
        agent = await self.agent()
        limit = self.count("limit", DEFAULT_PAGE, MAX_PAGE)
        offset = self.count("offset", 0, 10**9)
        envs, total = await agent.summaries(limit=limit, offset=offset)
        await self.reply({"envs": envs, "total": total, "offset": offset, "limit": limit})

    @web.authenticated
    @authorized
    @_handles_done
    async def post(self) -> None:
        """Ask for an environment: 201 + Location for a new one, 200 for a known one."""
        agent = await self.agent()
        holder = self.holder()
        data = await self.json_body()
        if not isinstance(data, dict):
            self.fail(400, "SpecError", "the body must be a JSON object (a spec)", field="")
            return
        # Under the agent's policy: the server's agent trusts a request to build, not to run.
        spec = await self.run(agent.parse_async(data))
        known = await agent.knows(spec.env_id)
        self.host.note_holder(holder)
        body = await self.run(self._ensure(agent, spec, holder))
        if not known:
            self.set_status(201)
            self.set_header("Location", self.request.path.rstrip("/") + "/" + spec.env_id)
        await self.reply(body)

    async def _ensure(self, agent: RuntimeEnvAgent, spec: Any, holder: str) -> dict[str, Any]:
        """Take the reference (and wait, with ``?wait=``); the env's status. A concurrent
        DELETE or rebuild may remove the env (and the reference) between the steps: it is
        asked for again, a few times, instead of answering 500."""
        for attempt in range(_ENSURE_ATTEMPTS):
            try:
                await agent.ensure(spec, holder, retry=self.flag("retry"))
                if self.flag("wait"):
                    # A failed build answers too: the body carries the error (FAILED).
                    with contextlib.suppress(BuildError):
                        await agent.wait(spec.env_id)
                status: dict[str, Any] = await agent.env_status(spec.env_id)
                return status
            except EnvNotFound:
                if attempt == _ENSURE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover


class EnvHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self, env_id: str) -> None:
        """One environment: state, holders, steps, context once READY, error once FAILED."""
        agent = await self.agent()
        env_id = await self.env_id(agent, env_id)
        await self.reply(await self.run(agent.env_status(env_id)))

    @web.authenticated
    @authorized
    @_handles_done
    async def delete(self, env_id: str) -> None:
        """Release the caller's reference and remove the env; 409 while others hold it
        (unless ``force=true``)."""
        agent = await self.agent()
        env_id = await self.env_id(agent, env_id)
        await agent.release(env_id, self.holder())
        removed = await self.run(agent.remove(env_id, force=self.flag("force")))
        await self.reply({"env_id": env_id, "removed": removed})


class HolderHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def delete(self, env_id: str, holder: str) -> None:
        """Drop one holder's reference; the env stays cached (evictable once unreferenced)."""
        agent = await self.agent()
        env_id = await self.env_id(agent, env_id)
        try:
            check_holder(holder)
        except InvalidName as exc:
            self.fail(404, "InvalidName", f"no holder {holder[:80]!r}: {exc}")
            return
        held = await agent.release(env_id, holder)
        await self.reply({"env_id": env_id, "holder": holder, "released": held})


class LogHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self, env_id: str) -> None:
        """The env's build log, as text."""
        agent = await self.agent()
        env_id = await self.env_id(agent, env_id)
        text = await self.run(agent.log(env_id))
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        # APIHandler.finish would force application/json.
        JupyterHandler.finish(self, text)


class GcHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def post(self) -> None:
        """Evict unreferenced resources, least recently used first, down to ``max_bytes``."""
        agent = await self.agent()
        data = await self.json_body(required=False)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(400, "ValueError", "the body must be a JSON object")
            return
        max_bytes = data.get("max_bytes")
        # bool is an int in Python; JSON's true is not a byte count.
        if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 0):
            self.fail(400, "ValueError", "max_bytes: expected a non-negative integer")
            return
        evicted = await agent.gc(max_bytes)
        await self.reply({"evicted": evicted, "freed_bytes": sum(e["size"] or 0 for e in evicted)})


class StatusHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """Is the agent up, and how many envs in each state: from memory, no I/O."""
        host = self.host
        await self.reply(
            {"version": __version__, "started": host.agent_started, "envs": host.state_counts()}
        )


default_handlers = [
    (rf"{API_PREFIX}/envs/?", EnvsHandler),
    (rf"{API_PREFIX}/envs/{_ENV_ID}/?", EnvHandler),
    (rf"{API_PREFIX}/envs/{_ENV_ID}/log/?", LogHandler),
    (rf"{API_PREFIX}/envs/{_ENV_ID}/holders/(?P<holder>[^/]+)/?", HolderHandler),
    (rf"{API_PREFIX}/gc/?", GcHandler),
    (rf"{API_PREFIX}/status/?", StatusHandler),
]
