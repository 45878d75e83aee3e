"""Kernels on a Dask node: ``ipykernel`` started by the node agent inside an env built there.

Who calls it: the Dask kernel provisioner (``kernels/remote.py``), in the Jupyter server,
through ``Client.run`` (coroutines on the Dask worker's loop; blocking work in threads, the
agent's work on the node agent's loop thread). Dask runs ``NodeKernelsPlugin`` on every
worker (registered by the provisioner next to ``NodeAgentPlugin``); its teardown kills the
node's kernels.

One start, step by step:

- ``node_kernel_load``: how busy this node is and whether the kernel's env is READY here
  (the provisioner picks a node with it, else the least loaded);
- ``node_kernel_build``: the staged env is built by the node agent with ``kernel:<id>`` as
  holder; its events (state, steps, installer lines) go to the provisioner as Dask events
  on the kernel's topic (``kernel_build.py``), so the server can show the build naming the node;
- ``node_kernel_start``: ipykernel starts in the env, bound to the node's own address, with
  ports chosen there and a key made there (``kernel_process.py``); the connection info goes
  back to the provisioner, never into a log (``Client.run`` logs the arguments of a call
  that fails, so the key is never an argument).

The kernel runs in its own session (interrupts reach its process group, not the Dask
worker), with ``JPY_PARENT_PID`` set to the Dask worker: ipykernel exits when its parent
goes, so a lost node leaves no kernel behind. A waiter thread reaps it and tells the
provisioner at once (kind ``exited``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from typing import Any

from distributed import WorkerPlugin
from distributed.worker import Worker

from ..errors import BuildError, KernelStartError
from ..session import CLUSTER_VAR
from .kernel_build import Forwarder, listen, one_line, unlisten
from .kernel_process import NodeKernel, kill, launch, node_ip, running, sweep
from .node import PLUGIN_NAME as NODE_PLUGIN_NAME
from .node import NodeAgent, NotStaged

PLUGIN_NAME = "jupyter-runtimeenv-node-kernels"
#: Set in a kernel's environment: its node (the Dask worker's address) and its kernel id.
KERNEL_NODE_VAR = "JUPYTER_RUNTIMEENV_KERNEL_NODE"
KERNEL_ID_VAR = "JUPYTER_RUNTIMEENV_REMOTE_KERNEL_ID"
log = logging.getLogger(__name__)
_KERNEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: How often a node looks for kernels whose lease ran out (their server is gone).
LEASE_CHECK_SECONDS = 2.0


class NodeKernelsPlugin(WorkerPlugin):
    """Keeps the kernels of one Dask worker; kills them when the worker closes."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.kernels: NodeKernels | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"kernels": None}

    async def setup(self, worker: Worker) -> None:
        self.kernels = NodeKernels(worker)

    async def teardown(self, worker: Worker) -> None:
        kernels, self.kernels = self.kernels, None
        if kernels is not None:
            await kernels.close()


class NodeKernels:
    """The kernels the node agent of one Dask worker runs."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.address = str(worker.address)
        self._kernels: dict[str, NodeKernel] = {}
        self._lock = threading.Lock()
        self._swept = False
        self._watchdog: asyncio.Task[None] | None = None

    # -- placement ---------------------------------------------------------------------------

    async def load(self, token: str) -> dict[str, Any]:
        """How busy this node is, and whether the env staged as ``token`` is READY here."""
        node = self._node()
        ready = False
        staged = node.spec_of(token) is not None
        if staged:
            with contextlib.suppress(Exception):  # not parsed, collected, unknown: not ready
                parsed = await asyncio.to_thread(node.parsed, token)
                status = await node.on_agent_loop(node.agent.env_status(parsed.env_id))
                ready = status.get("state") == "READY"
        with self._lock:
            busy = sum(1 for k in self._kernels.values() if running(k))
        return {
            "ready": ready,
            "staged": staged,
            "kernels": busy,
            "executing": len(self.worker.state.executing),
            "nthreads": int(self.worker.state.nthreads),
            "loadavg": os.getloadavg()[0] / max(1, os.cpu_count() or 1),
        }

    # -- the build ---------------------------------------------------------------------------

    async def build(
        self, kernel_id: str, token: str, topic: str, lease: float = 0.0
    ) -> dict[str, Any]:
        """Build the staged env with the kernel as holder; its env id and interpreter.
        ``lease``: the kernel's lease (seconds, 0: none) holds from now on, so a server that
        dies before the kernel runs leaves no env reference behind.

        ``KernelStartError`` (one line naming this node) when it is not staged or fails.
        """
        kernel = self._kernel(kernel_id, topic)
        self._hold(kernel, lease)
        node = self._node()
        if not self._swept:  # once per Dask worker: what crashed workers left behind
            self._swept = True
            await asyncio.to_thread(sweep, node.cache_root / "kernels")
        try:
            # Parsed once per node; NotStaged if its files were collected since staging.
            parsed = await asyncio.to_thread(node.parsed, token)
        except NotStaged:
            raise KernelStartError(
                f"the kernel's environment is not staged on Dask worker {self.address}"
                " (its files were collected meanwhile: start the kernel again)",
                node=self.address,
            ) from None
        except Exception as exc:
            raise KernelStartError(
                f"the kernel's environment is refused on Dask worker {self.address}: {exc}",
                node=self.address,
            ) from None
        forwarder = Forwarder(self.worker, topic, parsed.env_id)
        stop_listening = await node.on_agent_loop(listen(node, forwarder))
        try:
            # As the node's own builds do: no blob sweep while this build links its blobs.
            await asyncio.to_thread(node.enter_busy)
            try:
                ctx = await node.on_agent_loop(node.agent.get_or_create(parsed, _holder(kernel_id)))
            finally:
                node.leave_busy()
            await asyncio.to_thread(node.linked, token, ctx.env_id)  # its trees live with it
        except BuildError as exc:
            raise KernelStartError(
                f"building the kernel's environment failed on Dask worker {self.address}:"
                f" {one_line(exc)}",
                node=self.address,
                detail=exc.output_tail
                + ([f"(full log on the node: {exc.log_path})"] if exc.log_path else []),
            ) from None
        finally:
            await node.on_agent_loop(unlisten(stop_listening, forwarder))
        if kernel.ctx is not None and kernel.ctx.env_id != ctx.env_id:
            # A restart in a rebuilt env: drop the old env's reference, keep the new one.
            await node.on_agent_loop(node.agent.release(kernel.ctx.env_id, _holder(kernel_id)))
        if self._kernels.get(kernel_id) is not kernel:
            # Stopped while it built (its lease ran out: the server is gone).
            await node.on_agent_loop(node.agent.release(ctx.env_id, _holder(kernel_id)))
            raise KernelStartError(
                f"kernel {kernel_id} was stopped on Dask worker {self.address} while its"
                " environment was built",
                node=self.address,
            )
        kernel.ctx = ctx
        return {"env_id": ctx.env_id, "python": ctx.python}

    # -- the kernel process ------------------------------------------------------------------

    async def start(
        self,
        kernel_id: str,
        argv: list[str],
        env: Mapping[str, str],
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Start the kernel in its built env; its connection info once it bound its ports.
        ``options``: ``start_timeout`` (seconds), ``encrypt`` (CurveZMQ keys for it)."""
        kernel = self._known(kernel_id)
        if kernel.ctx is None:
            raise KernelStartError(
                f"the kernel's environment is not built on Dask worker {self.address}",
                node=self.address,
            )
        if running(kernel):
            raise KernelStartError(
                f"kernel {kernel_id} already runs on Dask worker {self.address}",
                node=self.address,
            )
        self._hold(kernel, float(options.get("lease", 0.0)))
        host = await asyncio.to_thread(node_ip, self.address)
        variables = {
            **env,
            "JPY_PARENT_PID": str(os.getpid()),
            "JUPYTER_RUNTIMEENV_CACHE": str(self._node().cache_root),
            KERNEL_NODE_VAR: self.address,
            KERNEL_ID_VAR: kernel_id,
            CLUSTER_VAR: str(self.worker.scheduler.address),  # its session's executor
        }
        return await asyncio.to_thread(
            launch,
            kernel,
            self.address,
            self._exited,
            host,
            argv,
            variables,
            float(options.get("start_timeout", 120.0)),
            bool(options.get("encrypt", False)),
        )

    def _hold(self, kernel: NodeKernel, lease: float) -> None:
        """The kernel's lease starts (again) now; the node watches leases from then on."""
        kernel.lease, kernel.renewed = lease, time.monotonic()
        if lease and self._watchdog is None:
            self._watchdog = asyncio.create_task(self._watch_leases())

    def _exited(self, kernel: NodeKernel, pid: int, code: int) -> None:
        """A kernel's waiter thread: tell the provisioner at once (``poll`` would, later)."""
        with contextlib.suppress(Exception):  # the worker is closing
            self.worker.log_event(
                kernel.topic,
                {"kind": "exited", "kernel_id": kernel.kernel_id, "pid": pid, "code": code},
            )

    async def signal(self, kernel_id: str, signum: int) -> bool:
        """Send ``signum`` to the kernel's process group; whether it was running."""
        kernel = self._kernels.get(kernel_id)
        if kernel is None or kernel.proc is None or not running(kernel):
            return False
        pid = kernel.proc.pid
        try:
            os.killpg(pid, signum)  # its own session: the group id is its pid
        except ProcessLookupError:
            return False
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return True

    async def poll(self, kernel_id: str) -> dict[str, Any]:
        """``{"exit": None}`` while the kernel runs, else its exit code (``known`` is
        false for a kernel this node never ran, e.g. after the Dask worker restarted)."""
        kernel = self._kernels.get(kernel_id)
        if kernel is None:
            return {"exit": -1, "known": False}
        kernel.renewed = time.monotonic()  # its provisioner asks: it is alive
        if kernel.proc is None:
            return {"exit": kernel.exit_code if kernel.exit_code is not None else -1, "known": True}
        return {"exit": kernel.proc.poll(), "known": True}

    def own(self, kernel_id: str, owner: str) -> bool:
        """Record that the kernel made the ``DaskExecutor`` ``owner``; whether it is known."""
        kernel = self._kernels.get(kernel_id)
        if kernel is None:
            return False
        kernel.owners.add(owner)
        return True

    async def stop(self, kernel_id: str, *, forget: bool) -> list[str]:
        """Kill the kernel and every process it started; the executors it made (their pools,
        on every node, are for the caller to close). With ``forget`` (not a restart),
        release its env and remove its directory too."""
        with self._lock:
            kernel = self._kernels.get(kernel_id)
            if kernel is not None and forget:
                del self._kernels[kernel_id]
        if kernel is None:
            return []
        await asyncio.to_thread(kill, kernel)
        owners, kernel.owners = sorted(kernel.owners), set()
        if not forget:
            return owners
        ctx, kernel.ctx = kernel.ctx, None
        if ctx is not None:
            node = self._node_or_none()
            if node is not None:
                with contextlib.suppress(Exception):  # a stopping agent dropped it already
                    await node.on_agent_loop(node.agent.release(ctx.env_id, _holder(kernel_id)))
        await asyncio.to_thread(shutil.rmtree, kernel.directory, True)
        return owners

    def info(self) -> dict[str, Any]:
        """The kernels of this node (tests and the provisioner's checks)."""
        with self._lock:
            kernels = list(self._kernels.values())
        return {
            k.kernel_id: {
                "pid": k.proc.pid if k.proc is not None else None,
                "running": running(k),
                "exit": k.exit_code,
                "env_id": k.ctx.env_id if k.ctx is not None else None,
                "directory": str(k.directory),
            }
            for k in kernels
        }

    def renew(self, kernel_ids: list[str]) -> list[str]:
        """Word from the kernels' provisioner: their leases start again. The ids this node
        does not know (any more)."""
        now = time.monotonic()
        unknown = []
        for kernel_id in kernel_ids:
            kernel = self._kernels.get(kernel_id)
            if kernel is None:
                unknown.append(kernel_id)
            else:
                kernel.renewed = now
        return unknown

    async def _watch_leases(self) -> None:
        """On the worker's loop while kernels run: stop a kernel whose provisioner has not
        been heard of for its lease (the server that started it died, or lost the cluster),
        as its shutdown would: kill it and its workers, release its env."""
        while True:
            await asyncio.sleep(LEASE_CHECK_SECONDS)
            now = time.monotonic()
            # Running or not (built and never started, exited, between restarts): a
            # kernel still holds its env reference until it is stopped.
            expired = [
                k for k in list(self._kernels.values())
                if k.lease and now - k.renewed > k.lease
            ]  # fmt: skip
            for kernel in expired:
                log.warning(
                    "jupyter_runtimeenv: kernel %s on %s: no word from its server for %g s;"
                    " stopping it",
                    kernel.kernel_id,
                    self.address,
                    kernel.lease,
                )
                with contextlib.suppress(Exception):
                    self.worker.log_event(
                        kernel.topic,
                        {"kind": "orphaned", "kernel_id": kernel.kernel_id},
                    )
                with contextlib.suppress(Exception):  # one kernel must not stop the watch
                    owners = await self.stop(kernel.kernel_id, forget=True)
                    for owner in owners:  # its pools on this node (others idle out)
                        await self._node().forget(owner)

    async def close(self) -> None:
        """Kill every kernel and release their envs (the Dask worker is closing)."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        for kernel_id in list(self._kernels):
            with contextlib.suppress(Exception):
                await self.stop(kernel_id, forget=True)

    # -- helpers -----------------------------------------------------------------------------

    def _node(self) -> NodeAgent:
        node = self._node_or_none()
        if node is None:
            raise KernelStartError(
                f"Dask worker {self.address} has no node agent (plugin missing)",
                node=self.address,
            )
        return node

    def _node_or_none(self) -> NodeAgent | None:
        node = getattr(self.worker.plugins.get(NODE_PLUGIN_NAME), "node", None)
        return node if isinstance(node, NodeAgent) else None

    def _kernel(self, kernel_id: str, topic: str) -> NodeKernel:
        if not _KERNEL_ID.fullmatch(kernel_id):
            raise KernelStartError(f"not a kernel id: {kernel_id[:80]!r}", node=self.address)
        with self._lock:
            kernel = self._kernels.get(kernel_id)
            if kernel is None:
                directory = self._node().cache_root / "kernels" / kernel_id
                kernel = self._kernels[kernel_id] = NodeKernel(kernel_id, topic, directory)
            kernel.topic = topic
            return kernel

    def _known(self, kernel_id: str) -> NodeKernel:
        kernel = self._kernels.get(kernel_id)
        if kernel is None:
            raise KernelStartError(
                f"Dask worker {self.address} does not know kernel {kernel_id[:80]!r}"
                " (it restarted?)",
                node=self.address,
            )
        return kernel


def _holder(kernel_id: str) -> str:
    return f"kernel:{kernel_id}"


# -- what the provisioner runs with Client.run (coroutines on the worker's loop) -----------


def _kernels_of(dask_worker: Worker) -> NodeKernels:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    if not isinstance(kernels, NodeKernels):
        raise KernelStartError(
            f"Dask worker {dask_worker.address} has no kernel plugin", node=str(dask_worker.address)
        )
    return kernels


async def node_kernel_load(token: str, dask_worker: Worker) -> dict[str, Any]:
    return await _kernels_of(dask_worker).load(token)


async def node_kernel_build(
    kernel_id: str, token: str, topic: str, lease: float, dask_worker: Worker
) -> dict[str, Any]:
    return await _kernels_of(dask_worker).build(kernel_id, token, topic, lease)


async def node_kernel_start(
    kernel_id: str,
    argv: list[str],
    env: dict[str, str],
    options: dict[str, Any],
    dask_worker: Worker,
) -> dict[str, Any]:
    return await _kernels_of(dask_worker).start(kernel_id, argv, env, options)


async def node_kernel_signal(kernel_id: str, signum: int, dask_worker: Worker) -> bool:
    return await _kernels_of(dask_worker).signal(kernel_id, signum)


async def node_kernel_poll(kernel_id: str, dask_worker: Worker) -> dict[str, Any]:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    if not isinstance(kernels, NodeKernels):
        return {"exit": -1, "known": False}
    return await kernels.poll(kernel_id)


async def node_kernel_stop(kernel_id: str, forget: bool, dask_worker: Worker) -> list[str]:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    if isinstance(kernels, NodeKernels):
        return await kernels.stop(kernel_id, forget=forget)
    return []


async def node_kernel_renew(kernel_ids: list[str], dask_worker: Worker) -> list[str]:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    return kernels.renew(kernel_ids) if isinstance(kernels, NodeKernels) else list(kernel_ids)


async def node_kernel_own(kernel_id: str, owner: str, dask_worker: Worker) -> bool:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    return isinstance(kernels, NodeKernels) and kernels.own(kernel_id, owner)


def claim_executor(executor: Any) -> None:
    """In a kernel on a Dask node: tell the node that ``executor`` (a ``DaskExecutor`` the
    kernel's session made) is the kernel's, so that its pools end with the kernel (on every
    node, at shutdown or restart, however the kernel ends). Elsewhere: nothing."""
    kernel_id = os.environ.get(KERNEL_ID_VAR)
    node = os.environ.get(KERNEL_NODE_VAR)
    if not kernel_id or not node:
        return
    try:
        executor.client.run(node_kernel_own, kernel_id, executor.id, workers=[node])
    except Exception as exc:  # the kernel still works; its pools then end by idling
        log.warning("jupyter_runtimeenv: cannot tie the executor to kernel %s: %s", kernel_id, exc)


async def node_kernel_info(dask_worker: Worker) -> dict[str, Any]:
    kernels = getattr(dask_worker.plugins.get(PLUGIN_NAME), "kernels", None)
    return kernels.info() if isinstance(kernels, NodeKernels) else {}
