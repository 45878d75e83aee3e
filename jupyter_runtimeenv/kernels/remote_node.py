"""A Dask kernel's configuration, its state, and its link to the node it runs on.

Who calls it: nothing directly; ``DaskKernelProvisioner`` (``remote.py``) is built on
``NodeKernel`` and adds the start, the running kernel's lifecycle and persistence. What it
owns: the provisioner's config traits (a kernelspec's ``kernel_provisioner.config``), the
kernel's node, pid and env id, calls to the node (in a thread, bounded), the watch on the
node's membership, the node's kernel events (exit, relayed build output), and the kernel's
end: an exit, or a loss of its node told once by name with the restarter told to give up.
The cluster's callbacks (``_on_node_removed``, ``_on_node_event``) arrive on the Dask
client's thread; what touches the kernel manager is moved to its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Dict, Float, Unicode

from ..errors import KernelStartError
from .cluster import ClusterLink, KernelEvents

#: The exit code ``poll`` reports for a kernel whose node was lost.
LOST = -int(signal.SIGKILL)


class NodeKernel(KernelProvisionerBase):
    """The configuration and node link of ``DaskKernelProvisioner`` (its docstring says
    what it does)."""

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

    # -- the node ------------------------------------------------------------------------------

    def _events_for_start(self) -> KernelEvents:
        if self._events is None:
            logger = getattr(self.parent, "event_logger", None)
            self._events = KernelEvents(
                str(self.kernel_id), self.scheduler, self.log, logger, asyncio.get_running_loop()
            )
        return self._events

    def _started_events(self) -> KernelEvents:
        return self._events if self._events is not None else self._events_for_start()

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
