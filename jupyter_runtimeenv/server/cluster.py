"""A kernel's Dask cluster in the sidebar: its report's ``cluster`` section, and the sidebar's
Stop and GC, carried out by the kernel.

| path | methods |
|---|---|
| ``kernels/{kernel_id}/workers/{pid}?node=ADDRESS`` | DELETE: stop a worker on a node |
| ``kernels/{kernel_id}/gc`` | POST: collect every node of the kernel's cluster |
| ``kernels/{kernel_id}/commands`` | GET (the kernel, long-polling): its pending commands |
| ``kernels/{kernel_id}/commands/{command_id}`` | POST (the kernel): a command's answer |

The server cannot reach a kernel's cluster itself (it may not even see its scheduler) and a
kernel is not a server, so the kernel carries them out: a kernel whose report has a cluster
long-polls its commands (``workers/commands.py``), runs each on its executor and answers.
The sidebar's request waits for that answer (at most ``ANSWER_SECONDS``: 504 after).
Only a worker that the kernel's own last report lists on that node may be stopped, and the
node checks again that the pid is one of that kernel's workers there.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from .cluster_report import listed
from .handlers import API_PREFIX, _handles_done
from .panel import _KERNEL_ID, WorkerHandler
from .panel_base import PanelHandler

#: How long the sidebar's Stop or GC waits for the kernel's answer; how long a kernel's
#: poll is held open at most.
ANSWER_SECONDS = 60.0
MAX_POLL_SECONDS = 30
#: Where the extension's command queues live in the tornado settings.
COMMANDS_KEY = "jupyter_runtimeenv_kernel_commands"


class KernelCommands:
    """Commands for kernels, queued until the kernel polls; each caller awaits its answer.
    Lives on the server's loop (no locks: one thread)."""

    def __init__(self) -> None:
        self._queues: dict[str, list[dict[str, Any]]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._answers: dict[str, tuple[str, asyncio.Future[dict[str, Any]]]] = {}
        self._ids = itertools.count(1)

    async def call(
        self, kernel_id: str, action: str, args: dict[str, Any], timeout: float = ANSWER_SECONDS
    ) -> dict[str, Any]:
        """Queue ``action`` for the kernel and wait for its answer; ``TimeoutError`` if none."""
        command_id = f"c{next(self._ids)}"
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[command_id] = (kernel_id, answer)
        self._queues.setdefault(kernel_id, []).append({"id": command_id, "action": action, **args})
        self._event(kernel_id).set()
        try:
            return await asyncio.wait_for(answer, timeout)
        finally:
            self._answers.pop(command_id, None)
            queue = self._queues.get(kernel_id, [])
            self._queues[kernel_id] = [c for c in queue if c["id"] != command_id]

    async def take(self, kernel_id: str, wait: float) -> list[dict[str, Any]]:
        """The kernel's pending commands, waiting up to ``wait`` seconds for one."""
        if not self._queues.get(kernel_id):
            event = self._event(kernel_id)
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), wait)
            except TimeoutError:
                return []
        taken, self._queues[kernel_id] = self._queues.get(kernel_id, []), []
        return taken

    def answer(self, kernel_id: str, command_id: str, body: dict[str, Any]) -> bool:
        """The kernel's answer to one of its commands; False if nobody waits for it."""
        waiting = self._answers.get(command_id)
        if waiting is None or waiting[0] != kernel_id or waiting[1].done():
            return False
        waiting[1].set_result(body)
        return True

    def drop(self, kernel_id: str) -> None:
        """The kernel is gone: its callers get no answer (they time out), its queue goes."""
        self._queues.pop(kernel_id, None)
        self._wake.pop(kernel_id, None)

    def _event(self, kernel_id: str) -> asyncio.Event:
        return self._wake.setdefault(kernel_id, asyncio.Event())


class ClusterHandler(PanelHandler):
    """Shared helpers of the cluster handlers."""

    @property
    def commands(self) -> KernelCommands:
        found = self.settings.get(COMMANDS_KEY)
        if not isinstance(found, KernelCommands):
            found = self.settings[COMMANDS_KEY] = KernelCommands()
        return found

    async def ask_kernel(self, kernel_id: str, action: str, **args: Any) -> dict[str, Any] | None:
        """Run ``action`` in the kernel; its answer's result, or ``None`` (a reply was sent:
        the kernel refused, or did not answer in time)."""
        try:
            answer = await self.commands.call(kernel_id, action, args)
        except TimeoutError:
            self.fail(
                504,
                "KernelTimeout",
                f"kernel {kernel_id} did not answer within {ANSWER_SECONDS:.0f} s (is it alive?)",
            )
            return None
        if not answer.get("ok"):
            status = answer.get("status")
            code = status if isinstance(status, int) and 400 <= status < 600 else 500
            self.fail(code, str(answer.get("type") or "KernelError"), str(answer.get("error")))
            return None
        result = answer.get("result")
        return result if isinstance(result, dict) else {}

    def cluster_of(self, kernel_id: str) -> dict[str, Any] | None:
        report = self.panel_host.kernel_reports.get(kernel_id)
        return (report or {}).get("cluster")


class NodeWorkerHandler(ClusterHandler, WorkerHandler):
    """``panel.WorkerHandler``'s route, answering ``?node=`` itself: registered before it."""

    @web.authenticated
    @authorized
    @_handles_done
    async def delete(self, kernel_id: str, pid: str) -> None:
        """Stop one worker a running kernel reported: ``?node=ADDRESS`` a worker on that
        node of the kernel's cluster, through the kernel; else a local one (the base's)."""
        node = self.query("node")
        if not node:
            local = super().delete(kernel_id, pid)  # the panel's own (typed loosely by tornado)
            if local is not None:
                await local
            return
        self.kernel_id_checked(kernel_id)
        report = self.panel_host.kernel_reports.get(kernel_id)
        if not listed(report, node, int(pid)):
            self.fail(
                404, "WorkerNotFound", f"kernel {kernel_id} reported no worker {pid} on {node}"
            )
            return
        if await self.ask_kernel(kernel_id, "stop_worker", node=node, pid=int(pid)) is None:
            return
        await self.reply({"kernel_id": kernel_id, "pid": int(pid), "node": node, "stopped": True})


class KernelGcHandler(ClusterHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def post(self, kernel_id: str) -> None:
        """Collect every node of the kernel's cluster to its budget, through the kernel:
        ``{"nodes": {address: freed bytes}, "freed_bytes": total}``."""
        self.kernel_id_checked(kernel_id)
        if self.cluster_of(kernel_id) is None:
            self.fail(404, "NoCluster", f"kernel {kernel_id} reported no cluster")
            return
        result = await self.ask_kernel(kernel_id, "gc")
        if result is None:
            return
        nodes = result.get("nodes")
        freed = {
            str(node): int(amount)
            for node, amount in (nodes.items() if isinstance(nodes, dict) else [])
            if isinstance(amount, int) and not isinstance(amount, bool)
        }
        await self.reply(
            {"kernel_id": kernel_id, "nodes": freed, "freed_bytes": sum(freed.values())}
        )


class KernelCommandsHandler(ClusterHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self, kernel_id: str) -> None:
        """The kernel's pending commands (the kernel polls: ``?wait=`` seconds, held open
        until one comes)."""
        self.kernel_id_checked(kernel_id)
        wait = self.count("wait", 0, MAX_POLL_SECONDS)
        await self.reply({"commands": await self.commands.take(kernel_id, wait)})


class KernelCommandAnswerHandler(ClusterHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def post(self, kernel_id: str, command_id: str) -> None:
        """A command's answer, from the kernel: ``{"ok", "result" | "error", "type",
        "status"}``."""
        self.kernel_id_checked(kernel_id)
        body = await self.json_body()
        if not isinstance(body, dict):
            self.fail(400, "ValueError", "answer: expected a JSON object")
            return
        if not self.commands.answer(kernel_id, command_id, body):
            self.fail(404, "CommandNotFound", f"no command {command_id} waits for an answer")
            return
        self.set_status(204)
        self.finish()


_COMMAND_ID = r"(?P<command_id>c[0-9]{1,18})"

cluster_handlers = [
    # Before panel_handlers: the same route as panel.WorkerHandler, with ?node= answered here.
    (rf"{API_PREFIX}/kernels/{_KERNEL_ID}/workers/(?P<pid>[0-9]{{1,10}})/?", NodeWorkerHandler),
    (rf"{API_PREFIX}/kernels/{_KERNEL_ID}/gc/?", KernelGcHandler),
    (rf"{API_PREFIX}/kernels/{_KERNEL_ID}/commands/?", KernelCommandsHandler),
    (rf"{API_PREFIX}/kernels/{_KERNEL_ID}/commands/{_COMMAND_ID}/?", KernelCommandAnswerHandler),
]
