"""``DaskKernelProvisioner``: a whole notebook kernel on a Dask node, in an env built there.

A kernelspec made with ``jupyter runtimeenv kernelspec install NAME SPEC --dask ADDRESS``
names it (``runtime-env-dask-provisioner``) with the spec and the scheduler in its config.
Who calls it: jupyter_client's ``KernelManager`` (the Jupyter server's, or a script's), on
its own loop; every call to Dask runs in a thread, so that loop never waits on the cluster.

A start (``pre_launch`` then ``launch_kernel``), as it shows in the server's event stream
(``cluster.KERNEL_SCHEMA_ID``) and log, naming the node:

1. connect to the scheduler (one client per address in this process) and register the node
   agent and kernel plugins;
2. hash the spec's local files into the server's blob store (a manifest, as for tasks);
3. pick a node: on a restart the kernel's node while it lives; else one where the env is
   READY, else the least loaded (fewest kernels, then running tasks, then load average);
4. stage the manifest there (the node receives the blobs it lacks) and build the env with
   the kernel as holder, the build's steps and output streaming back as events;
5. start ``ipykernel`` in the env on the node (``dask/node_kernels.py``): bound to the node's
   address, ports chosen there, a key made there; the connection info comes back and the
   kernel manager talks ZMQ to the node directly.

Interrupt, terminate and kill are signals sent through the node agent; ``poll`` asks it
(at most twice a second; the kernel's exit and its node's loss also arrive as events). A
kernel whose node leaves the cluster is dead for good: one error line names the node, and
the server's restarter is told not to restart it elsewhere (its state died with the node).
A restart keeps the node, the key and (when free) the ports. ``cleanup`` kills whatever the
kernel left and releases its env reference on the node.

This module holds the start, the running kernel's lifecycle and persistence; the config
traits, the kernel's state and its link to the node are ``NodeKernel`` (``remote_node.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any, NoReturn, cast

from jupyter_client.connect import KernelConnectionInfo

from ..errors import KernelStartError, RuntimeEnvError
from ..session import NODE_CACHE_VAR
from . import placement
from .cluster import ClusterLink, KernelEvents
from .remote_node import NodeKernel

PROVISIONER_NAME = "runtime-env-dask-provisioner"
#: Passed from the server's environment to the kernel's (nothing else of the server's is).
_PASSED = ("JPY_SESSION_NAME",)
#: ``poll`` asks the node at most this often (the kernel manager polls every 0.1 s while
#: waiting for a shutdown).
POLL_INTERVAL = 0.5


class DaskKernelProvisioner(NodeKernel):
    """Starts the kernel on a node of the Dask cluster at ``scheduler``, inside the runtime
    environment in ``runtime_env``, built on that node."""

    # Its config, state and link to the node: ``NodeKernel`` (``remote_node.py``).

    # -- starting (called by KernelManager.pre_start_kernel / launch_kernel) -----------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Place the kernel, stage and build its env on the node. Called by
        ``KernelManager.pre_start_kernel`` on every start and restart."""
        kwargs = await super().pre_launch(**kwargs)
        env: dict[str, str] = kwargs.pop("env", {})
        extra = list(kwargs.pop("extra_arguments", []))
        kwargs.pop("cwd", None)  # the server's directory means nothing on the node
        events = self._events_for_start()
        try:
            await self._prepare(events)
        except BaseException as exc:
            await self._start_failed(exc, events)
        spec_env = dict(self.kernel_spec.env) if self.kernel_spec is not None else {}
        self._kernel_env = {
            **{k: env[k] for k in spec_env if k in env},
            **{k: env[k] for k in _PASSED if k in env},
            **({NODE_CACHE_VAR: self.node_cache_dir} if self.node_cache_dir else {}),
        }
        argv = list(self.kernel_spec.argv) if self.kernel_spec is not None else []
        return {**kwargs, "cmd": argv + extra}

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start ipykernel on the node; its connection info. Called by
        ``KernelManager.launch_kernel`` right after ``pre_launch``."""
        from ..dask.node_kernels import node_kernel_start

        events, node = self._started_events(), self._node()
        events.emit("starting", f"starting ipykernel on Dask worker {node}")
        try:
            info = await self._call(
                node_kernel_start,
                self.kernel_id,
                cmd,
                self._kernel_env or {},
                {
                    "start_timeout": self.start_timeout,
                    "encrypt": self._encrypted(),
                    "lease": self.lease_timeout,
                },
                timeout=self.start_timeout + self.request_timeout,
            )
        except BaseException as exc:
            await self._start_failed(exc, events)
        raw = dict(info["connection"])
        raw["key"] = str(raw["key"]).encode()  # the kernel manager compares bytes
        connection = cast(KernelConnectionInfo, raw)
        self.connection_info = connection
        self.pid = int(info["pid"])
        self._running, self._exit, self._polled = True, None, time.monotonic()
        self._stopping = False
        if self._link is not None and self.lease_timeout:
            self._link.lease(node, str(self.kernel_id), self.lease_timeout)
        events.emit(
            "started",
            f"kernel started on Dask worker {node} (pid {self.pid})",
            pid=self.pid,
            env_id=self.env_id,
        )
        return connection

    # -- the running kernel (called by the kernel manager and its restarter) -----------------

    async def poll(self) -> int | None:
        """``None`` while the kernel runs, else its exit code. Called by
        ``KernelManager.is_alive`` (the restarter, every few seconds; shutdown, 10 times a
        second: the node is asked at most every ``POLL_INTERVAL`` seconds)."""
        if self._exit is not None or not self._running:
            return self._exit if self._exit is not None else 0
        now = time.monotonic()
        if now - self._polled < POLL_INTERVAL:
            return None
        self._polled = now
        from ..dask.node_kernels import node_kernel_poll

        connected = self._link.connected() if self._link is not None else False
        if connected is None:
            return None  # the client is reconnecting: asking the node now would wait
        if not connected:
            self._lost(retired=False)
            return self._exit
        try:
            answer = await self._call(
                node_kernel_poll, self.kernel_id, timeout=self.request_timeout
            )
        except Exception:
            if await self._node_gone():
                self._lost(retired=False)
                return self._exit
            return None  # the scheduler is slow or away: the kernel itself may be fine
        if answer.get("exit") is not None and self._exit is None:
            if not answer.get("known", True):
                self._lost(retired=False, why="no longer knows the kernel (it restarted)")
            else:
                self._exited(int(answer["exit"]))
        return self._exit

    async def wait(self) -> int | None:
        """Wait until the kernel has exited. Called by the kernel manager while shutting
        down (under its own timeout)."""
        code = await self.poll()
        while code is None:  # the node tells the exit when asked (or by an event)
            await asyncio.sleep(0.1)
            code = await self.poll()
        self._running = False
        return code

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel's process group on its node (SIGINT interrupts). Called by
        ``KernelManager.signal_kernel`` and ``interrupt_kernel``."""
        if not self._running or self._exit is not None:
            return
        from ..dask.node_kernels import node_kernel_signal

        if signum == 0:
            await self.poll()
            return
        try:
            await self._call(
                node_kernel_signal, self.kernel_id, int(signum), timeout=self.request_timeout
            )
        except Exception as exc:
            if await self._node_gone():
                self._lost(retired=False)
                return
            raise RuntimeEnvError(
                f"cannot signal kernel {self.kernel_id} on Dask worker {self.node}: {exc}"
            ) from None

    async def shutdown_requested(self, restart: bool = False) -> None:
        """The kernel was asked to shut down: its exit is expected now. Called by
        ``KernelManager.request_shutdown``."""
        self._stopping = True

    async def kill(self, restart: bool = False) -> None:
        """SIGKILL the kernel. Called by ``KernelManager.kill_kernel``."""
        self._stopping = True
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        """SIGTERM the kernel. Called by ``KernelManager.finish_shutdown``."""
        self._stopping = True
        await self.send_signal(signal.SIGTERM)

    async def cleanup(self, restart: bool = False) -> None:
        """Kill what is left of the kernel on its node; unless it restarts, release its env
        there and the cluster link here. Called by ``KernelManager.cleanup_resources``."""
        from ..dask.node_kernels import node_kernel_stop

        self._running = False
        link, node = self._link, self.node
        if link is not None and node is not None and not await self._node_gone():
            try:
                owners = await self._call(
                    node_kernel_stop, self.kernel_id, not restart, timeout=self.request_timeout
                )
                await self._forget_pools(link, owners)
            except Exception as exc:  # a gone node took the kernel with it
                self.log.warning(
                    "jupyter_runtimeenv: kernel %s: stopping it on Dask worker %s failed: %s",
                    self.kernel_id,
                    node,
                    exc,
                )
        if restart:
            return
        if self._events is not None and self.failure is None:
            self._events.emit("stopped", f"kernel stopped on Dask worker {node}")
        await self._disconnect()

    # -- persistence (jupyter_client's contract for remote kernels) -------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update({"node": self.node, "pid": self.pid, "scheduler": self.scheduler})
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.node = provisioner_info.get("node")
        self.pid = provisioner_info.get("pid")
        self.scheduler = provisioner_info.get("scheduler") or self.scheduler
        self._running = self.node is not None
        if self._running:
            self._link = await asyncio.to_thread(
                ClusterLink.acquire, self.scheduler, self.connect_timeout
            )
            self._link.subscribe(self.topic, self._on_node_event)
            self._watch()
            if self.node is not None and self.lease_timeout:
                # This process renews it from now on.
                self._link.lease(self.node, str(self.kernel_id), self.lease_timeout)

    # -- a start's steps, and a failed start --------------------------------------------------

    async def _start_failed(self, exc: BaseException, events: KernelEvents) -> NoReturn:
        """A start failed (or was cancelled): tell it in one line naming the node, and leave
        nothing behind (a half-started kernel, its env reference and directory on the node,
        this kernel's use of the cluster link). The kernel manager does not call ``cleanup``
        for a start that raised."""
        error: BaseException = exc
        if isinstance(exc, Exception) and not isinstance(exc, KernelStartError):
            where = f" on Dask worker {self.node}" if self.node else ""
            text = " ".join(str(exc).split()) or type(exc).__name__
            if not isinstance(exc, RuntimeEnvError):
                text = f"{type(exc).__name__}: {text}"
            error = KernelStartError(
                f"kernel {self.kernel_id} could not start{where}: {text}", node=self.node or ""
            )
        if isinstance(error, KernelStartError):
            events.emit("failed", str(error))
            for line in error.detail:
                self.log.error("jupyter_runtimeenv: kernel %s: | %s", self.kernel_id, line)
        await asyncio.shield(self._abandon())
        if error is exc:
            raise exc
        raise error from None

    async def _abandon(self) -> None:
        from ..dask.node_kernels import node_kernel_stop

        self._running = False
        link, node = self._link, self.node
        if link is not None and node is not None and not await self._node_gone():
            with contextlib.suppress(Exception):  # best effort: the node may be going away
                owners = await self._call(
                    node_kernel_stop, self.kernel_id, True, timeout=self.request_timeout
                )
                await self._forget_pools(link, owners)
        await self._disconnect()

    def _encrypted(self) -> bool:
        """Whether the kernel manager asks for CurveZMQ (its ``transport_encryption`` is
        ``required``, or ``auto`` and the kernelspec declares ``supported_encryption``)."""
        km: Any = self.parent
        try:
            policy = km._transport_encryption_policy()
            supported = bool(km._kernel_supports_curve_encryption())
        except Exception:  # an older jupyter_client, or no kernel manager: no encryption
            return False
        return bool(policy == "required" or (policy == "auto" and supported))

    async def _prepare(self, events: KernelEvents) -> None:
        from ..dask.node_kernels import node_kernel_build

        if not self.scheduler:
            raise KernelStartError(
                "the kernelspec names no Dask scheduler (metadata.kernel_provisioner.config"
                ".scheduler)"
            )
        self._exit, self.failure = None, None
        if self._link is None:
            events.emit("placing", f"connecting to the Dask scheduler {self.scheduler}")
            self._link = await asyncio.to_thread(
                ClusterLink.acquire, self.scheduler, self.connect_timeout
            )
            self._link.subscribe(self.topic, self._on_node_event)
        link = self._link
        await asyncio.to_thread(link.ensure_plugins, self.node_cache_dir)
        manifest, store = await placement.manifest_for(self.runtime_env)
        node, reason = await placement.place(link, manifest.token, self.scheduler, self.node)
        if node != self.node:
            self._drop_watch()
            if self.node is not None:
                link.unlease(self.node, str(self.kernel_id))  # its old node is gone
            self.node = node
        events.node = node
        if reason is not None:
            events.emit("placed", f"placed on Dask worker {node} ({reason})")
        if self._unwatch is None:
            self._watch()
        size = manifest.size
        events.emit(
            "staging",
            f"staging the environment on Dask worker {node} ({size} bytes of local files)",
            bytes=size,
        )
        await placement.stage_on(link, manifest, node, store)
        if self.lease_timeout:
            # From the build on: a server that dies before the kernel runs leaves nothing.
            link.lease(node, str(self.kernel_id), self.lease_timeout)
        events.emit("state", f"building the environment on Dask worker {node}", state="BUILDING")
        built = await self._call(
            node_kernel_build, self.kernel_id, manifest.token, self.topic, self.lease_timeout
        )
        self.env_id = str(built["env_id"])
        events.emit(
            "state",
            f"environment {self.env_id[:12]} READY on Dask worker {node}",
            state="READY",
            env_id=self.env_id,
        )


__all__ = ["PROVISIONER_NAME", "DaskKernelProvisioner"]
