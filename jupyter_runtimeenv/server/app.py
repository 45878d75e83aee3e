"""``RuntimeEnvExtension``: one agent per Jupyter server, serving every notebook of the user.

The agent lives on the server's event loop. It is created when the extension loads and started
on first use (pytest-jupyter and some deployments never call the post-start hook), and stopped
when the server stops, which cancels builds and kills their processes.

Kernels find the agent through ``JUPYTER_RUNTIMEENV_URL`` and ``JUPYTER_RUNTIMEENV_TOKEN``, which
the extension puts into the server's environment: jupyter_client copies ``os.environ`` into
every kernel it launches. The token is the server's own token (a kernel can read it from the
server's runtime file anyway), so the identity provider and the authorizer see the server's
user, with no side door in the handlers.

A kernel's references are held under ``kernel:<kernel id>`` (or ``kernel:<kernel id>/<more>``);
they are released when the kernel manager reports the kernel shut down (the ``kernel_actions``
event) and, for kernels that die without a shutdown, by a periodic sweep that compares the
kernels that were running with those that still are. A kernel keeps its id across restarts but
not its process: references its process took (``kernel:<id>/pool:<pid>:...``,
``kernel:<id>/runtime_env-magic:<pid>:...``) are released as soon as that process is gone, at
the restart event and by the same sweep (an auto-restart after the kernel was killed included);
``kernel:<id>`` itself (the provisioner's, for a kernel started in an env) stays while the
kernel does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import threading
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.serverapp import ServerApp
from traitlets import Float, Int, List, Unicode

from ..agent import RuntimeEnvAgent
from ..agent.core import DEFAULT_MAX_CACHE_BYTES
from ..agent.events import Event
from ..agent.parsing import DEFAULT_MAX_PARSES, DEFAULT_PARSE_TIMEOUT
from ..agent.pgroups import LIVE
from ..client import TOKEN_ENV_VAR, URL_ENV_VAR
from ..errors import CacheUnavailable
from ..spec import SpecPolicy
from ..workers import stops
from .cluster import cluster_handlers
from .events import KERNEL_SCHEMA_PATH, SCHEMA_ID, SCHEMA_PATH, EventForwarder
from .handlers import API_PREFIX, SETTINGS_KEY, default_handlers
from .holders import (
    KERNEL_HOLDER_PREFIX,
    holder_process,
    holds_for_kernel,
    kernel_holder,
    process_gone,
)
from .kernels import WORKERS_SCHEMA_ID, WORKERS_SCHEMA_PATH, KernelReports
from .panel import panel_handlers
from .subscribe import DEFAULT_BUFFER_BYTES, BoundedSubscribeWebsocket
from .subscribe import SETTINGS_KEY as EVENTS_BUFFER_KEY

KERNEL_ACTIONS_SCHEMA = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"

_current: RuntimeEnvExtension | None = None


async def local_agent() -> RuntimeEnvAgent | None:
    """The started agent of the server extension running in this process, if any.

    Called by the kernel provisioner, which runs in the server's process and loop: it uses the
    agent directly rather than calling the server over HTTP.
    """
    if _current is None or _current.agent is None:
        return None
    return await _current.started_agent()


class RuntimeEnvExtension(ExtensionApp):
    """The Jupyter server extension hosting the runtime environment agent."""

    name = "jupyter_runtimeenv"
    description = "Runtime environments for notebooks: build, cache and serve them"

    cache_dir = Unicode(
        None,
        allow_none=True,
        config=True,
        help="The cache root (default: $JUPYTER_RUNTIMEENV_CACHE or the user cache dir).",
    )
    max_cache_bytes = Int(
        DEFAULT_MAX_CACHE_BYTES,
        config=True,
        help="Unreferenced resources are evicted, least recently used first, above this size.",
    )
    max_concurrent_installs = Int(2, config=True, help="Installs that may run at once.")
    max_concurrent_downloads = Int(4, config=True, help="Downloads that may run at once.")
    build_timeout = Float(
        None,
        allow_none=True,
        config=True,
        help="Upper bound in seconds on every build (specs may ask for less); None: no bound.",
    )
    allowed_plugins = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Import paths of plugins (package.module.Class) that specs sent to the server may"
        " name in their 'plugins' field, besides the plugins registered through the entry point"
        " group 'jupyter_runtimeenv.plugins'. Default: none. Listing one lets every authorized"
        " user import it in the server.",
    )
    max_spec_bytes = Int(
        2**20,
        config=True,
        help="The largest request body (a spec) the REST API accepts, in bytes: 413 beyond.",
    )
    parse_timeout = Float(
        DEFAULT_PARSE_TIMEOUT,
        allow_none=True,
        config=True,
        help="Seconds a request may wait for its spec to be parsed (reading the files it names,"
        " hashing its directories) before a 400; None: no bound. Parses run in threads of"
        " their own, never holding the server's shutdown.",
    )
    max_concurrent_parses = Int(
        DEFAULT_MAX_PARSES, config=True, help="Specs that may be parsed at once (in threads)."
    )
    events_buffer_bytes = Int(
        DEFAULT_BUFFER_BYTES,
        config=True,
        help="Bytes the events websocket (/api/events/subscribe) may hold for one subscriber"
        " that does not read; past it, that subscriber is disconnected.",
    )
    kernel_sweep_interval = Float(
        10.0,
        config=True,
        help="Seconds between checks for kernels that died, whose references are then released.",
    )

    agent: RuntimeEnvAgent | None = None

    @property
    def server(self) -> ServerApp:
        """The server this extension is linked to (set by jupyter_server before loading)."""
        assert self.serverapp is not None
        return self.serverapp

    # -- lifecycle (called by jupyter_server's extension manager) -----------------------

    def initialize_settings(self) -> None:
        """Create the agent and wire events and kernels. Called by ``ExtensionApp.initialize``
        when the server loads the extension, before the event loop runs."""
        global _current
        self.agent = RuntimeEnvAgent(
            self.cache_dir,
            max_cache_bytes=self.max_cache_bytes,
            max_concurrent_installs=self.max_concurrent_installs,
            max_concurrent_downloads=self.max_concurrent_downloads,
            build_timeout=self.build_timeout,
            parse_timeout=self.parse_timeout,
            max_concurrent_parses=self.max_concurrent_parses,
            # Requests reach this agent over REST (browsers, kernels): trusted to build only.
            # Requirements and environment files are read below the server's root only.
            policy=SpecPolicy.untrusted(
                self.allowed_plugins or (), files_root=self.server.root_dir
            ),
        )
        self._start_lock: asyncio.Lock | None = None
        self._started = False
        self._stopped = False
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._known_kernels: set[str] = set()
        self._states: dict[str, str] = {}
        self._state_counts: dict[str, int] = {}  # kept with _states: GET status is O(1)
        logger = self.server.event_logger
        assert logger is not None  # ServerApp.initialize made it before loading extensions
        logger.register_event_schema(SCHEMA_PATH)
        logger.register_event_schema(WORKERS_SCHEMA_PATH)
        logger.register_event_schema(KERNEL_SCHEMA_PATH)
        self.forwarder = EventForwarder(logger)
        self.kernel_reports = KernelReports(
            lambda data: logger.emit(schema_id=WORKERS_SCHEMA_ID, data=data),
            self._kernel_pid,
            self._envs_used,
            notes_dir=_stop_notes_dir(self.server.runtime_dir),
        )
        self._unlisten = [
            self.agent.add_listener(self.forwarder),
            self.agent.add_listener(self._track_state),
            self.agent.on_holders(self._holders_changed),
        ]
        logger.add_listener(schema_id=KERNEL_ACTIONS_SCHEMA, listener=self._on_kernel_action)
        self._saved_environ = {
            k: os.environ.get(k) for k in (URL_ENV_VAR, TOKEN_ENV_VAR, stops.NOTES_ENV_VAR)
        }
        self.export_environment()
        self.settings[SETTINGS_KEY] = self
        self.settings[EVENTS_BUFFER_KEY] = self.events_buffer_bytes
        _current = self

    def initialize_handlers(self) -> None:
        """Called by ``ExtensionApp`` to collect the handlers (it prefixes ``base_url``)."""
        self.handlers.extend(default_handlers)
        self.handlers.extend(cluster_handlers)  # first: it answers one of the panel's routes
        self.handlers.extend(panel_handlers)
        # The server's own events socket, bounded per subscriber (matched before the core's).
        self.handlers.append((r"/api/events/subscribe", BoundedSubscribeWebsocket))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Called by the extension manager once the server's loop runs (not under
        pytest-jupyter): the port is final now, and the agent can start early."""
        self.export_environment()
        self._hook_hangup()
        with contextlib.suppress(CacheUnavailable):  # logged; requests answer 503 with it
            await self.started_agent()

    def _hook_hangup(self) -> None:
        """SIGHUP stops the server the way SIGTERM does, through the server's own stop path
        (``ServerApp.stop``, whose cleanup calls ``stop_extension``): jupyter_server leaves
        SIGHUP at its default, which would end the process with installers still running.
        A handler someone else installed is left alone."""
        self._previous_hup: Any = None
        hup = getattr(signal, "SIGHUP", None)
        if hup is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(hup) not in (signal.SIG_DFL, None):
            return
        self._previous_hup = signal.signal(hup, self._on_hangup)

    def _on_hangup(self, signum: int, frame: Any) -> None:
        self.log.critical("jupyter_runtimeenv: received SIGHUP, stopping the server")
        self.server.stop(from_signal=True)

    async def stop_extension(self) -> None:
        """Stop the agent (cancelling builds, killing their processes) and restore the
        environment. Called by the server's cleanup, before it shuts the kernels down."""
        global _current
        if self._stopped:
            return
        self._stopped = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server.event_logger is not None:
            self.server.event_logger.remove_listener(
                schema_id=KERNEL_ACTIONS_SCHEMA, listener=self._on_kernel_action
            )
        if self.agent is not None and self._started:
            await self.agent.stop()  # its last events (builds cancelled) still go out
        LIVE.kill_all()  # a net: cancelled builds killed their groups already
        if getattr(self, "_previous_hup", None) is not None:
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(signal.SIGHUP, self._previous_hup)
        for unlisten in self._unlisten:
            unlisten()
        self.forwarder.close()
        for key, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self.kernel_reports.notes_dir is not None:
            shutil.rmtree(self.kernel_reports.notes_dir, ignore_errors=True)
        if _current is self:
            _current = None

    # -- the agent ------------------------------------------------------------------------

    async def started_agent(self) -> RuntimeEnvAgent:
        """The agent, started on first use. Called by handlers and the provisioner.

        ``CacheUnavailable`` (logged) when the cache cannot be opened; handlers answer 503.
        """
        assert self.agent is not None
        if self._stopped:
            raise RuntimeError("the jupyter_runtimeenv extension is stopped")
        if not self._started:
            if self._start_lock is None:
                self._start_lock = asyncio.Lock()
            async with self._start_lock:
                if not self._started:
                    try:
                        await self.agent.start()
                    except CacheUnavailable as exc:
                        # Not started: the next request tries again (the disk may be freed).
                        self.log.error("jupyter_runtimeenv: %s", exc)
                        raise
                    self._started = True
                    self._sweeper = asyncio.create_task(self._sweep_kernels())
        return self.agent

    @property
    def agent_started(self) -> bool:
        return self._started and not self._stopped

    def state_counts(self) -> dict[str, int]:
        """How many envs this server saw in each state; from memory (no I/O, for GET status).
        Kept up to date by ``_track_state``, not counted per request: with 10,000 stored envs
        counting made GET status 6x slower than with 10 (the scaling curve ``envs``)."""
        return dict(self._state_counts)

    def _envs_used(self, env_ids: list[str]) -> None:
        """Tasks ran in ``env_ids`` (a kernel's report says so): a use of each, for the
        sidebar's "used N ago" and LRU eviction. Called by ``KernelReports`` on the loop."""
        if self.agent is None or not self.agent_started:
            return
        agent = self.agent

        async def touch() -> None:
            for env_id in env_ids:
                with contextlib.suppress(Exception):  # gone, or not this agent's env
                    await agent.touch(env_id)

        self.spawn(touch())

    def _holders_changed(self, env_id: str) -> None:
        """A reference was taken or dropped: tell the event stream's subscribers (the sidebar
        asks the REST API who holds it, by name)."""
        logger = self.server.event_logger
        if logger is not None:
            logger.emit(schema_id=SCHEMA_ID, data={"kind": "holders", "env_id": env_id})

    def _track_state(self, event: Event) -> None:
        if event.kind != "state":
            return
        counts = self._state_counts
        old = self._states.pop(event.env_id, None)
        if old is not None:
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
        if not event.data.get("removed"):
            new = str(event.data.get("state"))
            self._states[event.env_id] = new
            counts[new] = counts.get(new, 0) + 1

    # -- kernels --------------------------------------------------------------------------

    def kernel_url(self) -> str:
        """The URL of the REST API as seen from a kernel on this machine."""
        app = self.server
        if app.sock:
            return str(app.connection_url) + API_PREFIX.lstrip("/") + "/"
        ip = app.ip
        if ip in ("", "localhost", "0.0.0.0", "*", "127.0.0.1"):
            host = "127.0.0.1"
        elif ip in ("::", "::1"):
            host = "[::1]"
        else:
            host = f"[{ip}]" if ":" in ip else ip
        scheme = "https" if app.certfile else "http"
        return f"{scheme}://{host}:{app.port}{app.base_url}{API_PREFIX.lstrip('/')}/"

    def export_environment(self) -> None:
        """Put the URL and token into ``os.environ``, which kernels started later inherit.
        Called at load and again at start (the port may change in between)."""
        os.environ[URL_ENV_VAR] = self.kernel_url()
        if self.kernel_reports.notes_dir is not None:
            os.environ[stops.NOTES_ENV_VAR] = self.kernel_reports.notes_dir
        token = self.server.identity_provider.token
        if token:
            os.environ[TOKEN_ENV_VAR] = token
        else:
            os.environ.pop(TOKEN_ENV_VAR, None)

    async def release_kernel(self, kernel_id: str) -> list[str]:
        """Release every reference held for ``kernel_id``; the env ids released. Called on a
        kernel's shutdown event and by the sweep when a kernel disappeared."""
        if self._stopped or not self._started or self.agent is None:
            return []
        released = []
        for env_id, holder in await self.agent.holders_matching(kernel_holder(kernel_id)):
            if holds_for_kernel(holder, kernel_id):
                await self.agent.release(env_id, holder)
                released.append(env_id)
        if released:
            self.log.info(
                "jupyter_runtimeenv: released %s env(s) of kernel %s", len(released), kernel_id
            )
        return released

    async def release_gone_processes(self, kernel_ids: set[str]) -> list[tuple[str, str]]:
        """Release the references that processes of ``kernel_ids`` took and that are gone
        (a restarted kernel's old process); the (env id, holder) released. Kernels without a
        local process (remote ones) are left alone: their pids mean nothing here. Called at a
        kernel's restart event and by the sweep."""
        if self._stopped or not self._started or self.agent is None or not kernel_ids:
            return []
        local = {k for k in kernel_ids if self._kernel_pid(k) is not None}
        refs = await self.agent.holders_matching(KERNEL_HOLDER_PREFIX)
        stale = []
        for env_id, holder in refs:
            kernel_id = holder[len(KERNEL_HOLDER_PREFIX) :].split("/", 1)[0]
            pid = holder_process(holder, kernel_id) if kernel_id in local else None
            if pid is not None:
                stale.append((env_id, holder, pid))
        gone = await asyncio.to_thread(lambda: {p for _, _, p in stale if process_gone(p)})
        released = []
        for env_id, holder, pid in stale:
            if pid in gone:
                await self.agent.release(env_id, holder)
                released.append((env_id, holder))
        if released:
            self.log.info(
                "jupyter_runtimeenv: released %s reference(s) of kernel processes that are gone",
                len(released),
            )
        return released

    def note_holder(self, holder: str) -> None:
        """Remember the kernel behind a ``kernel:<id>`` holder if this server runs it, so that
        the sweep releases its references even if it dies before the next sweep. Called by
        the POST handler."""
        if not holder.startswith(KERNEL_HOLDER_PREFIX):
            return
        kernel_id = holder[len(KERNEL_HOLDER_PREFIX) :].split("/", 1)[0]
        if kernel_id in self._running_kernels():
            self._known_kernels.add(kernel_id)

    async def _on_kernel_action(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        if data.get("action") == "restart" and data.get("kernel_id"):
            self.kernel_reports.drop(str(data["kernel_id"]))  # its workers died with it
            await self.release_gone_processes({str(data["kernel_id"])})
        if data.get("action") == "shutdown" and data.get("kernel_id"):
            self.kernel_reports.drop(str(data["kernel_id"]))
            await self.release_kernel(str(data["kernel_id"]))

    def _running_kernels(self) -> set[str]:
        manager = self.server.kernel_manager
        running = set(manager.list_kernel_ids())
        running.update(getattr(manager, "_pending_kernels", {}))
        return running

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background, owned by the extension: cancelled when the server
        stops. Called by the sidebar's handlers (a rebuild's follow-up)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def running_kernels(self) -> set[str]:
        """The ids of the kernels this server runs. Called by the sidebar's handlers."""
        return self._running_kernels()

    def _kernel_pid(self, kernel_id: str) -> int | None:
        """The process id of a running kernel (None if unknown): a worker to stop must be
        its child."""
        try:
            kernel = self.server.kernel_manager.get_kernel(kernel_id)
        except KeyError:
            return None
        pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
        return pid if isinstance(pid, int) else None

    async def _sweep_kernels(self) -> None:
        """Release references of kernels that vanished (died, culled) since the last look."""
        while True:
            await asyncio.sleep(self.kernel_sweep_interval)
            running = self._running_kernels()
            self.kernel_reports.prune(running)
            for kernel_id in self._known_kernels - running:
                try:
                    await self.release_kernel(kernel_id)
                except Exception:  # the sweep must outlive one bad release
                    self.log.exception("jupyter_runtimeenv: releasing kernel %s failed", kernel_id)
            self._known_kernels = running
            try:
                await self.release_gone_processes(running)
            except Exception:
                self.log.exception("jupyter_runtimeenv: releasing gone kernel processes failed")


def _stop_notes_dir(runtime_dir: str) -> str | None:
    """A directory of this server's own (in Jupyter's runtime dir, private) for the notes a
    Stop leaves its kernel (``workers/stops.py``); None if it cannot be made (the kernel
    then reports such a worker as killed by SIGKILL)."""
    try:
        os.makedirs(runtime_dir, exist_ok=True)
        return tempfile.mkdtemp(prefix=f"runtimeenv-stops-{os.getpid()}-", dir=runtime_dir)
    except OSError:
        return None
