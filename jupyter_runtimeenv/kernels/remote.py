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
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any, NoReturn, cast

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Dict, Float, Unicode

from ..errors import KernelStartError, RuntimeEnvError
from ..session import NODE_CACHE_VAR
from . import placement
from .cluster import ClusterLink, KernelEvents

PROVISIONER_NAME = "runtime-env-dask-provisioner"
#: Passed from the server's environment to the kernel's (nothing else of the server's is).
_PASSED = ("JPY_SESSION_NAME",)
#: ``poll`` asks the node at most this often (the kernel manager polls every 0.1 s while
#: waiting for a shutdown).
POLL_INTERVAL = 0.5
#: The exit code ``poll`` reports for a kernel whose node was lost.
LOST = -int(signal.SIGKILL)


class DaskKernelProvisioner(KernelProvisionerBase):
    """Starts the kernel on a node of the Dask cluster at ``scheduler``, inside the runtime
    environment in ``runtime_env``, built on that node."""

    runtime_env = Dict(config=True, help="The runtime env spec the kernel starts in.")
    scheduler = Unicode(
        "", config=True, help="The Dask scheduler's address (tcp://host:port, tls://...)."
    )
    node_cache_dir = Unicode(
        None,
        allow_none=True,
        config=True,
        help="Each node's cache root, formatted with the Dask worker's name and id"
        " ('/scratch/jre-{name}'); default: the node's own default.",
    )
    connect_timeout = Float(30.0, config=True, help="Seconds to reach the scheduler.")
    start_timeout = Float(
        120.0,
        config=True,
        help="Seconds for ipykernel to come up on the node once its env is built.",
    )
    request_timeout = Float(
        30.0, config=True, help="Seconds for the node to answer a signal, a poll or a stop."
    )
    lease_timeout = Float(
        120.0,
        config=True,
        help="Seconds a kernel lives on its node without word from this server (renewed every"
        " 10 s, or a third of this, while the server runs): a server that died leaves no"
        " kernel. 0: forever.",
    )

    node: str | None = None
    pid: int | None = None
    env_id: str | None = None
    #: Why the kernel is dead when its node was lost (one line, naming the node).
    failure: str | None = None

    _link: ClusterLink | None = None
    _events: KernelEvents | None = None
    _running: bool = False
    _stopping: bool = False
    _exit: int | None = None
    _polled: float = 0.0
    _unwatch: Callable[[], None] | None = None
    _kernel_env: dict[str, str] | None = None

    @property
    def has_process(self) -> bool:
        return self._running

    @property
    def topic(self) -> str:
        return f"jupyter-runtimeenv-kernel-{self.kernel_id}"

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

    async def _forget_pools(self, link: ClusterLink, owners: list[str]) -> None:
        """Close the pools the kernel's own executors left on every node (the kernel is
        gone; whatever its tasks started goes with it)."""
        from ..dask.node_ops import node_forget

        if not owners:
            return
        nodes = await asyncio.to_thread(link.nodes)
        for owner in owners:
            await asyncio.wait_for(
                asyncio.to_thread(link.run_all, node_forget, owner, nodes=nodes),
                self.request_timeout,
            )

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

    # -- internals ---------------------------------------------------------------------------

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

    def _events_for_start(self) -> KernelEvents:
        if self._events is None:
            logger = getattr(self.parent, "event_logger", None)
            self._events = KernelEvents(
                str(self.kernel_id), self.scheduler, self.log, logger, asyncio.get_running_loop()
            )
        return self._events

    def _started_events(self) -> KernelEvents:
        return self._events if self._events is not None else self._events_for_start()

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

    async def _call(
        self, function: Callable[..., Any], *args: Any, timeout: float | None = None
    ) -> Any:
        """``function(*args)`` on the kernel's node, in a thread; its answer or exception.
        ``KernelStartError`` naming the node if it does not answer within ``timeout``."""
        link, node = self._link, self._node()
        if link is None:
            raise KernelStartError(f"kernel {self.kernel_id} is not connected", node=node)
        call = asyncio.to_thread(link.run, function, *args, node=node)
        try:
            return await asyncio.wait_for(call, timeout)
        except asyncio.TimeoutError:
            raise KernelStartError(
                f"Dask worker {node} did not answer within {timeout:g} s", node=node
            ) from None

    def _node(self) -> str:
        if self.node is None:
            raise KernelStartError(f"kernel {self.kernel_id} has no node")
        return self.node

    async def _node_gone(self) -> bool:
        """Whether the kernel's node is no longer a worker of the cluster."""
        if self._link is None or self.node is None:
            return True
        if self.failure is not None or self._link.connected() is False:
            return True
        try:
            nodes = await asyncio.wait_for(
                asyncio.to_thread(self._link.nodes), self.request_timeout
            )
        except Exception:
            return False  # the scheduler cannot tell: assume the node is still there
        return self.node not in nodes

    def _watch(self) -> None:
        if self._link is not None and self.node is not None:
            self._unwatch = self._link.watch(self.node, self._on_node_removed)

    def _drop_watch(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    def _on_node_removed(self, node: str, retired: bool) -> None:
        """The client's thread: the kernel's node left the cluster. Handled on the kernel
        manager's loop (it touches the manager's restarter)."""
        if not self._running or node != self.node:
            return
        loop = self._events.loop if self._events is not None else None
        if loop is None or loop.is_closed():
            self._lost(retired=retired)
            return
        with contextlib.suppress(RuntimeError):  # that loop closed just now
            loop.call_soon_threadsafe(lambda: self._lost(retired=retired))

    def _on_node_event(self, message: dict[str, Any]) -> None:
        """The client's thread: an event of this kernel from its node."""
        kind = str(message.get("kind", ""))
        events = self._events
        if kind == "exited":
            if self._running and message.get("pid") == self.pid:
                self._exited(int(message.get("code", -1)))
            return
        if events is not None:
            events.relay(message)

    def _exited(self, code: int) -> None:
        if self._exit is not None:
            return
        self._exit = code
        if self._events is None:
            return
        if self._stopping:  # asked for: the cleanup's "stopped" tells it
            self._events.emit("exited", pid=self.pid, code=code)
        else:
            self._events.emit(
                "exited",
                f"the kernel on Dask worker {self.node} died (exit code {code})",
                pid=self.pid,
                code=code,
            )

    def _lost(self, *, retired: bool, why: str = "") -> None:
        """The kernel's node is gone: the kernel is dead for good, told once, by name."""
        if self.failure is not None:
            return
        if not why and self._link is not None and self._link.connected() is False:
            why = f"was lost with the Dask scheduler {self.scheduler} (it cannot be reached)"
        what = why or ("was retired" if retired else "left the cluster (lost)")
        self.failure = f"kernel {self.kernel_id} is dead: its Dask worker {self.node} {what}"
        self._exit = LOST if self._exit is None else self._exit
        if self._events is not None:
            self._events.emit("lost", self.failure)
        else:
            self.log.error("jupyter_runtimeenv: %s", self.failure)
        _no_restart(self.parent)

    async def _disconnect(self) -> None:
        self._drop_watch()
        link, self._link = self._link, None
        if link is not None and self.node is not None:
            link.unlease(self.node, str(self.kernel_id))
        if link is not None:
            link.unsubscribe(self.topic)
            await asyncio.to_thread(link.release)
        self.node = None


def _no_restart(manager: Any) -> None:
    """Make the kernel manager's restarter declare the kernel dead at its next poll instead
    of restarting it on another node: it counts consecutive restarts and gives up (firing
    its ``dead`` callbacks: the server tells the frontends and forgets the kernel) once the
    count passes its limit. jupyter_client has no public switch for this."""
    restarter = getattr(manager, "_restarter", None)
    limit = getattr(restarter, "restart_limit", None)
    if restarter is None or not isinstance(limit, int):
        return
    with contextlib.suppress(Exception):
        restarter._restarting = True
        restarter._restart_count = limit


__all__ = ["PROVISIONER_NAME", "DaskKernelProvisioner"]
