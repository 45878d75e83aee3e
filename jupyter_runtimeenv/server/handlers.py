"""The REST API under ``{base_url}jupyter-runtimeenv/api/`` (described in ``openapi.yaml``).

Every method is ``authenticated`` and ``authorized`` on the resource ``jupyter_runtimeenv``
(GET is ``read``; POST and DELETE are ``write``). Parsing a spec may hash files, so it runs in
a thread: the server's loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web

from .._version import __version__
from ..errors import BuildError, CacheUnavailable, EnvInUse, EnvNotFound, SpecError

if TYPE_CHECKING:
    from ..agent import RuntimeEnvAgent
    from .app import RuntimeEnvExtension

AUTH_RESOURCE = "jupyter_runtimeenv"
API_PREFIX = "/jupyter-runtimeenv/api"

DEFAULT_HOLDER = "user"
_ENV_ID = r"(?P<env_id>[^/]+)"


class RuntimeEnvHandler(APIHandler):
    """Base of the handlers: the extension, the agent, JSON errors from our exceptions."""

    auth_resource = AUTH_RESOURCE

    @property
    def extension(self) -> RuntimeEnvExtension:
        ext: RuntimeEnvExtension = self.settings["jupyter_runtimeenv"]
        return ext

    async def agent(self) -> RuntimeEnvAgent:
        try:
            return await self.extension.started_agent()
        except RuntimeError as exc:  # the server is stopping
            raise web.HTTPError(503, str(exc)) from exc
        except CacheUnavailable as exc:  # full or read-only disk: logged by the extension
            self.fail(503, "CacheUnavailable", str(exc), path=exc.path, cause=exc.cause)
            raise _Done from None

    def holder(self) -> str:
        # A server serves one user, and token-authenticated requests get a fresh anonymous
        # username each time (jupyter_server's default identity provider): the default holder
        # is therefore one name, not the username.
        holder = self.get_query_argument("holder", "") or DEFAULT_HOLDER
        if len(holder) > 512:
            raise web.HTTPError(400, "holder: longer than 512 characters")
        return holder

    def flag(self, name: str) -> bool:
        return self.get_query_argument(name, "false").lower() in ("1", "true", "yes")

    def json_body(self, *, required: bool = True) -> Any:
        body = self.request.body
        if not body and not required:
            return None
        try:
            return json.loads(body or b"")
        except ValueError as exc:
            self.fail(400, "SpecError", f"the body is not valid JSON: {exc}", field="")
            raise _Done from None

    def fail(self, status: int, kind: str, message: str, **extra: Any) -> None:
        self.set_status(status)
        self.finish({"type": kind, "message": message, **extra})

    async def run(self, coro: Any) -> Any:
        """Await ``coro`` turning our errors into responses (``_Done`` when one was sent)."""
        try:
            return await coro
        except SpecError as exc:
            self.fail(400, type(exc).__name__, str(exc), field=exc.field, reason=exc.reason)
        except EnvNotFound as exc:
            self.fail(404, "EnvNotFound", f"no environment {exc}")
        except EnvInUse as exc:
            self.fail(409, "EnvInUse", str(exc))
        raise _Done


class _Done(Exception):
    """A response was already written."""


def _handles_done(method: Any) -> Any:
    # Innermost decorator: a response written by ``fail`` ends the request quietly.
    async def inner(self: RuntimeEnvHandler, *args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(_Done):
            await method(self, *args, **kwargs)

    inner.__name__ = method.__name__
    inner.__doc__ = method.__doc__
    return inner


class EnvsHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """Every environment the agent or its cache knows."""
        agent = await self.agent()
        self.finish({"envs": await agent.status()})

    @web.authenticated
    @authorized
    @_handles_done
    async def post(self) -> None:
        """Ask for an environment: 201 + Location for a new one, 200 for a known one."""
        agent = await self.agent()
        data = self.json_body()
        if not isinstance(data, dict):
            self.fail(400, "SpecError", "the body must be a JSON object (a spec)", field="")
            return
        spec = await self.run(asyncio.to_thread(agent.parse, data))
        holder = self.holder()
        try:
            await agent.env_status(spec.env_id)
            known = True
        except EnvNotFound:
            known = False
        self.extension.note_holder(holder)
        await agent.ensure(spec, holder, retry=self.flag("retry"))
        if self.flag("wait"):
            # A failed build answers too: the body carries the error; the env exists (FAILED).
            with contextlib.suppress(BuildError):
                await agent.wait(spec.env_id)
        body = await agent.env_status(spec.env_id)
        if not known:
            self.set_status(201)
            self.set_header("Location", self.request.path.rstrip("/") + "/" + spec.env_id)
        self.finish(body)


class EnvHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self, env_id: str) -> None:
        """One environment: state, holders, steps, context once READY, error once FAILED."""
        agent = await self.agent()
        self.finish(await self.run(agent.env_status(env_id)))

    @web.authenticated
    @authorized
    @_handles_done
    async def delete(self, env_id: str) -> None:
        """Release the caller's reference and remove the env; 409 while others hold it
        (unless ``force=true``)."""
        agent = await self.agent()
        await self.run(agent.env_status(env_id))
        await agent.release(env_id, self.holder())
        removed = await self.run(agent.remove(env_id, force=self.flag("force")))
        self.finish({"env_id": env_id, "removed": removed})


class HolderHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def delete(self, env_id: str, holder: str) -> None:
        """Drop one holder's reference; the env stays cached (evictable once unreferenced)."""
        agent = await self.agent()
        await self.run(agent.env_status(env_id))
        held = await agent.release(env_id, holder)
        self.finish({"env_id": env_id, "holder": holder, "released": held})


class LogHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self, env_id: str) -> None:
        """The env's build log, as text."""
        agent = await self.agent()
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
        data = self.json_body(required=False) or {}
        max_bytes = data.get("max_bytes") if isinstance(data, dict) else None
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            self.fail(400, "ValueError", "max_bytes: expected a non-negative integer")
            return
        self.finish({"evicted": await agent.gc(max_bytes)})


class StatusHandler(RuntimeEnvHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """Is the agent up, and how many envs in each state: from memory, no I/O."""
        ext = self.extension
        self.finish(
            {"version": __version__, "started": ext.agent_started, "envs": ext.state_counts()}
        )


default_handlers = [
    (rf"{API_PREFIX}/envs/?", EnvsHandler),
    (rf"{API_PREFIX}/envs/{_ENV_ID}/?", EnvHandler),
    (rf"{API_PREFIX}/envs/{_ENV_ID}/log/?", LogHandler),
    (rf"{API_PREFIX}/envs/{_ENV_ID}/holders/(?P<holder>[^/]+)/?", HolderHandler),
    (rf"{API_PREFIX}/gc/?", GcHandler),
    (rf"{API_PREFIX}/status/?", StatusHandler),
]
