"""``ServerClient``: a kernel's way to the agent of the Jupyter server that started it.

``get_client()`` builds one from ``JUPYTER_RUNTIMEENV_URL`` and ``JUPYTER_RUNTIMEENV_TOKEN``.
Requests use ``urllib`` (the standard library, no event loop needed): the ``_sync`` methods call
it directly, the async ones in a thread, so they work from a kernel whose loop is running.

Holders are scoped to the kernel: inside a kernel, holder ``h`` is sent as
``kernel:<kernel id>/h``, so every reference the kernel takes (for itself, its worker pools,
anything) is released by the server when the kernel shuts down or dies. The kernel id comes
from ``JUPYTER_RUNTIMEENV_KERNEL_ID`` (set by the provisioner) or from the name of the
kernel's connection file (``kernel-<id>.json``, how jupyter_server names them).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from ..context import EnvContext
from ..errors import (
    AgentUnavailable,
    BuildError,
    EnvInUse,
    EnvNotFound,
    PluginNotFound,
    RuntimeEnvError,
    SpecError,
)
from ..spec import RuntimeEnvSpec

KERNEL_ID_VAR = "JUPYTER_RUNTIMEENV_KERNEL_ID"
_CONNECTION_FILE = re.compile(r"kernel-(?P<id>[0-9A-Za-z_-]+)\.json")


def current_kernel_id() -> str | None:
    """The id of the kernel this process is, if it is one started by a Jupyter server."""
    kernel_id = os.environ.get(KERNEL_ID_VAR)
    if kernel_id:
        return kernel_id
    try:
        from ipykernel.connect import get_connection_file

        found = _CONNECTION_FILE.fullmatch(os.path.basename(get_connection_file()))
    except Exception:  # not in a kernel (no IPKernelApp instance), or no ipykernel
        return None
    return found.group("id") if found else None


class ServerClient:
    """The ``AgentClient`` that talks to the server's REST API."""

    def __init__(
        self,
        url: str,
        token: str = "",
        *,
        kernel_id: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self.token = token
        self.timeout = timeout
        self._kernel_id = kernel_id

    @property
    def kernel_id(self) -> str | None:
        if self._kernel_id is None:
            self._kernel_id = current_kernel_id()
        return self._kernel_id

    def scoped(self, holder: str) -> str:
        """``holder`` as recorded by the server: under this kernel's holder when in a kernel."""
        kernel_id = self.kernel_id
        if not kernel_id:
            return holder
        base = f"kernel:{kernel_id}"
        if holder == base or holder.startswith(base + "/"):
            return holder
        return f"{base}/{holder}" if holder else base

    # -- sync ---------------------------------------------------------------------------

    def acquire_sync(
        self, spec: RuntimeEnvSpec | Mapping[str, Any], holder: str, *, retry: bool = False
    ) -> EnvContext:
        data = spec.to_json() if isinstance(spec, RuntimeEnvSpec) else dict(spec)
        params = {"wait": "true", "holder": self.scoped(holder)}
        if retry:
            params["retry"] = "true"
        # The build may take as long as the spec allows: no socket timeout while waiting.
        body = self._request("POST", "envs", params=params, body=data, timeout=None)
        if body.get("state") == "READY" and body.get("context"):
            return EnvContext.from_json(body["context"])
        if body.get("error"):
            raise BuildError.from_json(body["error"])
        raise AgentUnavailable(f"unexpected answer from the server's agent: {body!r}")

    def release_sync(self, env_id: str, holder: str) -> None:
        path = f"envs/{_quote(env_id)}/holders/{_quote(self.scoped(holder))}"
        self._request("DELETE", path)

    def status_sync(self) -> list[dict[str, Any]]:
        """Summaries of every env (``env_status_sync`` has one env's spec and context)."""
        envs: list[dict[str, Any]] = []
        while True:
            page = self._request("GET", "envs", params={"offset": str(len(envs))})
            envs.extend(page["envs"])
            if not page["envs"] or len(envs) >= int(page.get("total", 0)):
                return envs

    def env_status_sync(self, env_id: str) -> dict[str, Any]:
        """One env: state, holders, steps, context once READY, error once FAILED."""
        env: dict[str, Any] = self._request("GET", f"envs/{_quote(env_id)}")
        return env

    def log_sync(self, env_id: str) -> str:
        text: str = self._request("GET", f"envs/{_quote(env_id)}/log", text=True)
        return text

    def remove_sync(self, env_id: str, *, force: bool = False) -> list[str]:
        params = {"force": "true"} if force else {}
        removed: list[str] = self._request("DELETE", f"envs/{_quote(env_id)}", params=params)[
            "removed"
        ]
        return removed

    def report_sync(self, report: Mapping[str, Any]) -> None:
        """Send this kernel's report (its pools, its declared env) to the server, which shows
        it in the sidebar. Called by ``workers.report``'s thread."""
        if self.kernel_id:
            self._request("POST", f"kernels/{_quote(self.kernel_id)}", body=dict(report))

    def commands_sync(self, wait: float) -> list[dict[str, Any]]:
        """The commands the server holds for this kernel (the sidebar's Stop and GC on its
        cluster), waiting up to ``wait`` seconds for one. Called by ``workers.commands``."""
        if not self.kernel_id:
            return []
        answer = self._request(
            "GET",
            f"kernels/{_quote(self.kernel_id)}/commands",
            params={"wait": str(int(wait))},
            timeout=wait + self.timeout,
        )
        commands = answer.get("commands") if isinstance(answer, dict) else None
        return [c for c in commands or [] if isinstance(c, dict)]

    def answer_sync(self, command_id: str, answer: Mapping[str, Any]) -> None:
        """This kernel's answer to one of its commands."""
        if self.kernel_id:
            path = f"kernels/{_quote(self.kernel_id)}/commands/{_quote(command_id)}"
            self._request("POST", path, body=dict(answer))

    # -- async (the same requests, in a thread) -------------------------------------------

    async def acquire(
        self, spec: RuntimeEnvSpec | Mapping[str, Any], holder: str, *, retry: bool = False
    ) -> EnvContext:
        return await asyncio.to_thread(self.acquire_sync, spec, holder, retry=retry)

    async def release(self, env_id: str, holder: str) -> None:
        await asyncio.to_thread(self.release_sync, env_id, holder)

    async def status(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.status_sync)

    async def log(self, env_id: str) -> str:
        return await asyncio.to_thread(self.log_sync, env_id)

    async def remove(self, env_id: str, *, force: bool = False) -> list[str]:
        return await asyncio.to_thread(self.remove_sync, env_id, force=force)

    def close(self) -> None:
        """Nothing to close: every request opens and closes its own connection."""

    # -- transport ----------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        text: bool = False,
        timeout: float | None = -1.0,
    ) -> Any:
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        # -1: the client's default; None: no timeout (waiting for a build).
        wait = self.timeout if timeout is not None and timeout < 0 else timeout
        try:
            with urllib.request.urlopen(request, timeout=wait) as response:
                raw = response.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            raise _convert(exc) from None
        except (OSError, ValueError) as exc:  # URLError, refused, timeout, bad URL
            raise AgentUnavailable(
                f"cannot reach the Jupyter server's runtime env agent at {self.url}: {exc}"
            ) from exc
        return raw if text else json.loads(raw or "null")


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _convert(exc: urllib.error.HTTPError) -> Exception:
    """The package's exception for an HTTP error answer of the REST API."""
    try:
        info = json.loads(exc.read().decode("utf-8") or "{}")
    except ValueError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    message = str(info.get("message") or exc.reason)
    if exc.code == 400 and info.get("type") in ("SpecError", "PluginNotFound"):
        kind = PluginNotFound if info["type"] == "PluginNotFound" else SpecError
        return kind(str(info.get("field", "")), str(info.get("reason") or message))
    if exc.code == 400:
        return RuntimeEnvError(f"the Jupyter server refused the request: {message}")
    if exc.code == 404:
        return EnvNotFound(message)
    if exc.code == 409:
        return EnvInUse(message)
    if exc.code == 403:
        return AgentUnavailable(
            f"the Jupyter server refused the request (403): {message}; is the token right?"
        )
    return AgentUnavailable(f"the Jupyter server answered {exc.code}: {message}")
