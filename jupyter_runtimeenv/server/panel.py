"""REST endpoints of the JupyterLab sidebar, next to the core API in ``handlers.py``.

| path | methods |
|---|---|
| ``overview`` | GET every env with size, last use and named holders, and every kernel's workers |
| ``envs/{env_id}/rebuild`` | POST: retry a failed env, or remove an unheld one and build it again |
| ``kernels`` | GET every kernel's last report |
| ``kernels/{kernel_id}`` | POST a kernel's report (its pools, its declared env); GET it |
| ``kernels/{kernel_id}/notebook_env`` | GET the kernel's declared env as notebook metadata |
| ``kernels/{kernel_id}/workers/{pid}`` | DELETE: stop one reported worker |
| ``notebook_env`` | POST a notebook's ``metadata.runtime_env``: the state of its env |
| ``gc/unreferenced`` | GET the envs nobody holds and the bytes each frees; POST: remove them |

Holders are named as a user knows them: ``kernel:<id>...`` becomes the notebook path of the
kernel's session (or ``kernel <id8>``), ``cli`` becomes ``CLI``, the magic's and pools' holders
say so. Everything that touches the cache or parses a spec runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
from typing import Any, Protocol

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import EnvInUse, EnvNotFound, SpecError
from ..notebook_meta import DRIVER_FIELDS, notebook_metadata
from ..spec.ids import is_env_id
from ..spec.paths import base_dir
from .cluster_report import validate_full
from .handlers import (
    API_PREFIX,
    DEFAULT_HOLDER,
    SETTINGS_KEY,
    AgentHost,
    RuntimeEnvHandler,
    _handles_done,
)
from .kernels import MAX_REPORT_BYTES, KernelReports, ReportError

_KERNEL_ID = r"(?P<kernel_id>[0-9A-Za-z_-]{1,64})"
#: The overview reads the stored spec (for its brief) of this many most recently used envs;
#: the others show their field names only (``GET envs/{id}`` has the spec).
OVERVIEW_SPECS = 50
OVERVIEW_PAGE = 500
_KERNEL_HOLDER = re.compile(r"^kernel:(?P<id>[^/]+)(?:/(?P<rest>.*))?$")
#: The holder of a rebuild nobody else holds, for as long as the build runs.
REBUILD_HOLDER = "rebuild"
_STATE_OF_NOTEBOOK_ENV = {"READY": "cached", "BUILDING": "building", "PENDING": "building"}


def name_holder(holder: str, paths: dict[str, str]) -> dict[str, str]:
    """``{"id", "label", "kind"}`` of a holder; ``paths`` maps kernel ids to notebook paths."""
    found = _KERNEL_HOLDER.match(holder)
    if found:
        kernel_id, rest = found.group("id"), found.group("rest") or ""
        label = paths.get(kernel_id) or f"kernel {kernel_id[:8]}"
        if rest.startswith("pool:"):
            label += " (workers)"
        elif rest.startswith("runtime_env-magic:"):
            label += " (%runtime_env)"
        elif rest.startswith("name:"):
            label += f" ({rest[5:]})"
        elif not rest:  # the provisioner's: the kernel runs in this env
            label += " (kernel's env)"
        return {"id": holder, "label": label, "kind": "kernel", "kernel_id": kernel_id}
    if holder == "cli":
        return {"id": holder, "label": "CLI", "kind": "cli"}
    if holder == DEFAULT_HOLDER:
        return {"id": holder, "label": "REST (user)", "kind": "user"}
    if holder == REBUILD_HOLDER:
        return {"id": holder, "label": "rebuild (sidebar)", "kind": "rebuild"}
    if holder.startswith("name:"):
        return {"id": holder, "label": f"env {holder[5:]}", "kind": "named"}
    if holder.startswith("pool:"):
        return {"id": holder, "label": "workers (script)", "kind": "pool"}
    return {"id": holder, "label": holder, "kind": "other"}


class PanelHost(AgentHost, Protocol):
    """What the sidebar's handlers need from the extension, beyond ``AgentHost``."""

    @property
    def kernel_reports(self) -> KernelReports: ...

    def running_kernels(self) -> set[str]: ...

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background, cancelled when the server stops."""


class PanelHandler(RuntimeEnvHandler):
    """Shared helpers of the sidebar's handlers."""

    @property
    def panel_host(self) -> PanelHost:
        host: PanelHost = self.settings[SETTINGS_KEY]
        return host

    async def kernel_paths(self) -> dict[str, str]:
        """Kernel id -> notebook path of its session (the server's session manager)."""
        manager = self.settings.get("session_manager")
        if manager is None:
            return {}
        try:
            sessions = await manager.list_sessions()
        except Exception:  # a broken session store must not break the panel
            self.log.warning("jupyter_runtimeenv: cannot list sessions", exc_info=True)
            return {}
        return {
            s["kernel"]["id"]: s.get("path") or s.get("name") or ""
            for s in sessions
            if s.get("kernel")
        }

    def user_name(self) -> str | None:
        """Who sent this request as people know them; None for an anonymous user (token
        only: jupyter_server makes up a uuid and a moon's name for each browser)."""
        user = self.current_user
        username = getattr(user, "username", None)
        if not isinstance(username, str) or re.fullmatch(r"[0-9a-f]{32}", username):
            return None
        name = getattr(user, "display_name", None) or getattr(user, "name", None)
        return str(name or username)

    def kernel_id_checked(self, kernel_id: str) -> str:
        if kernel_id not in self.panel_host.running_kernels():
            raise web.HTTPError(404, f"no running kernel {kernel_id}")
        return kernel_id

    def root_dir(self) -> str:
        root = str(self.settings.get("server_root_dir") or ".")
        return os.path.abspath(os.path.expanduser(root))

    def notebook_dir(self, path: str, report: dict[str, Any]) -> str:
        if path:
            rel = posixpath.dirname(path.lstrip("/"))
            full = os.path.normpath(os.path.join(self.root_dir(), rel))
            if full == self.root_dir() or full.startswith(self.root_dir() + os.sep):
                return full
            raise web.HTTPError(400, "path: outside the server's root directory")
        return str(report.get("cwd") or self.root_dir())


class OverviewHandler(PanelHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """A page of envs (size, last use, named holders; the spec of the most recently used
        ones, steps and error of those not READY) and every kernel's report."""
        agent = await self.agent()
        limit = self.count("limit", OVERVIEW_PAGE, OVERVIEW_PAGE)
        offset = self.count("offset", 0, 10**9)
        envs, total = await agent.summaries(limit=limit, offset=offset)
        ids = [e["env_id"] for e in envs]
        sizes = await asyncio.to_thread(_env_sizes, agent.cache, ids)
        recent = sorted(envs, key=lambda e: e.get("last_used") or 0, reverse=True)
        detailed = {e["env_id"] for e in recent[:OVERVIEW_SPECS] if e["state"] == "READY"}
        detailed |= {e["env_id"] for e in envs if e["state"] != "READY"}
        paths = await self.kernel_paths()
        reports = self.panel_host.kernel_reports
        reports.prune(self.panel_host.running_kernels())
        out = []
        for env in envs:
            full: dict[str, Any] = {}
            if env["env_id"] in detailed:
                try:
                    full = await agent.env_status(env["env_id"])
                except EnvNotFound:  # removed meanwhile
                    continue
            out.append(
                {
                    "env_id": env["env_id"],
                    "state": full.get("state", env["state"]),
                    "spec": full.get("spec"),
                    "fields": env.get("fields", []),
                    "error": full.get("error", env.get("error")),
                    "steps": full.get("steps") or {},
                    "created": env.get("created"),
                    "last_used": env.get("last_used") or env.get("updated"),
                    "size": sizes.get(env["env_id"]),
                    "holders": [name_holder(h, paths) for h in env.get("holders", [])],
                }
            )
        kernels = [{**r, "path": paths.get(r["kernel_id"], "")} for r in reports.all()]
        await self.reply({"envs": out, "total": total, "kernels": kernels})


def _env_sizes(cache: Any, env_ids: list[str]) -> dict[str, int]:
    """env id -> bytes of its resources. Blocking (the index): a thread."""
    sizes = {r["uri"]: r["size"] or 0 for r in cache.resources()}
    return {e: sum(sizes.get(u, 0) for u in cache.env_uris(e)) for e in env_ids}


class RebuildHandler(PanelHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def post(self, env_id: str) -> None:
        """Build an env again from its spec: a FAILED one is retried; a READY one is removed
        (409 while others than the caller hold it, unless ``force=true``) and built anew.

        The env keeps its holders: their references outlive the removal (see
        ``RuntimeEnvAgent.remove``), and the rebuild takes no reference of its own beyond the
        build (an env nobody holds is held by ``rebuild`` while it builds, then by nobody)."""
        agent = await self.agent()
        env_id = await self.env_id(agent, env_id)
        env = await self.run(agent.env_status(env_id))
        if env["state"] in ("PENDING", "BUILDING"):
            self.fail(409, "EnvBusy", f"environment {env_id} is building already")
            return
        spec = await self.run(agent.parse_async(env["spec"]))
        holders = [h for h in env.get("holders", []) if h != REBUILD_HOLDER]
        if env["state"] == "READY":
            others = [h for h in holders if h != self.holder()]
            if others and not self.flag("force"):
                self.fail(
                    409,
                    "EnvInUse",
                    f"environment {env_id} is held by {', '.join(others)}; use force to rebuild",
                )
                return
            await self.run(agent.remove(env_id, force=True))
        holder = holders[0] if holders else REBUILD_HOLDER
        status = await agent.ensure(spec, holder, retry=True)
        if not holders:
            self.panel_host.spawn(_release_after_build(agent, env_id))
        self.set_status(202)
        await self.reply(status)


async def _release_after_build(agent: Any, env_id: str) -> None:
    with contextlib.suppress(Exception):  # a failure is the env's state, shown by the panel
        await agent.wait(env_id)
    with contextlib.suppress(EnvNotFound):
        await agent.release(env_id, REBUILD_HOLDER)


class KernelsHandler(PanelHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """Every running kernel's last report, with its notebook path."""
        reports = self.panel_host.kernel_reports
        reports.prune(self.panel_host.running_kernels())
        paths = await self.kernel_paths()
        await self.reply(
            {"kernels": [{**r, "path": paths.get(r["kernel_id"], "")} for r in reports.all()]}
        )


class KernelReportHandler(PanelHandler):
    spec_methods = frozenset({"POST"})  # a report carries the kernel's declared spec

    def body_limit(self) -> int:
        # Published to every events subscriber: bounded below the spec limit.
        return min(super().body_limit(), MAX_REPORT_BYTES)

    @web.authenticated
    @authorized
    @_handles_done
    async def get(self, kernel_id: str) -> None:
        report = self.panel_host.kernel_reports.get(kernel_id)
        if report is None:
            raise web.HTTPError(404, f"kernel {kernel_id} has not reported")
        await self.reply(report)

    @web.authenticated
    @authorized
    @_handles_done
    async def post(self, kernel_id: str) -> None:
        """A kernel's report: its pools and workers, its declared env, its cwd."""
        self.kernel_id_checked(kernel_id)
        try:
            report = validate_full(await self.json_body())  # the cluster section too
        except ReportError as exc:
            self.fail(400, "ReportError", str(exc))
            return
        self.panel_host.kernel_reports.put(kernel_id, report)
        self.set_status(204)
        self.finish()


class WorkerHandler(PanelHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def delete(self, kernel_id: str, pid: str) -> None:
        """Stop one worker a running kernel reported (its pool sees it die)."""
        self.kernel_id_checked(kernel_id)
        reports = self.panel_host.kernel_reports
        try:
            await asyncio.to_thread(reports.stop_worker, kernel_id, int(pid), self.user_name())
        except LookupError as exc:
            self.fail(404, "WorkerNotFound", str(exc))
            return
        await self.reply({"kernel_id": kernel_id, "pid": int(pid), "stopped": True})


class KernelNotebookEnvHandler(PanelHandler):
    @web.authenticated
    @authorized
    @_handles_done
    async def get(self, kernel_id: str) -> None:
        """The kernel's declared envs (the default and every named one) as
        ``metadata.runtime_env`` of notebook ``?path=``, each with the kernel's env id."""
        report = self.panel_host.kernel_reports.get(kernel_id)
        declared = [d for d in (report or {}).get("declared", []) if d.get("spec") is not None]
        if report is not None and not declared and report.get("runtime_env"):
            # A kernel of an older version reports its default only.
            declared = [{"name": None, "env_id": None, "spec": report["runtime_env"]}]
        if report is None or not declared:
            self.fail(
                404,
                "NoRuntimeEnv",
                "this notebook's kernel declared no environment (use %runtime_env first)",
            )
            return
        notebook_dir = self.notebook_dir(self.query("path"), report)
        meta = notebook_metadata(declared, notebook_dir, self.root_dir())
        agent = await self.agent()
        specs = [("", meta["spec"])] if "spec" in meta else []
        specs += [(f"named.{n}", e["spec"]) for n, e in meta.get("named", {}).items()]
        for field, spec in specs:  # each readable here again, or the error names its field
            await self.run(agent.parses.run(_parse_in, agent, spec, notebook_dir, field))
        await self.reply(meta)


def _parse_in(agent: Any, spec: dict[str, Any], directory: str, field: str = "") -> Any:
    """``spec`` parsed against ``directory``; a ``SpecError`` names its field under ``field``
    (``named.slow``) when given."""
    try:
        with base_dir(directory):
            return agent.parse(spec)
    except SpecError as exc:
        raise (exc.within(field) if field else exc) from None


def _core(spec: dict[str, Any]) -> dict[str, Any]:
    """What identifies a notebook's env across machines: no driver fields, no build config."""
    return {k: v for k, v in spec.items() if k not in (*DRIVER_FIELDS, "config")}


#: The badge's overall state is the first of these that any of the notebook's envs is in.
_WORST_FIRST = ("failed", "missing", "building", "cached")


class NotebookEnvHandler(PanelHandler):
    spec_methods = frozenset({"POST"})

    @web.authenticated
    @authorized
    @_handles_done
    async def post(self) -> None:
        """The state of a notebook's envs: body ``{"path": notebook path, "runtime_env":
        metadata}``; answers ``{"state", "env_id", "error", "default", "named": [...]}``, each
        entry ``{"name", "state": cached|building|failed|missing, "env_id", "error"}`` and
        ``state`` the worst of them. An env matches when its spec, without the driver's own
        fields, is the metadata's spec resolved against the notebook's directory; ``env_id``
        is that env's (the id the kernel shows), ``null`` when this server has none."""
        data = await self.json_body()
        if not isinstance(data, dict) or not isinstance(data.get("runtime_env"), dict):
            self.fail(400, "SpecError", "runtime_env: expected the notebook's metadata object")
            return
        meta = data["runtime_env"]
        wanted: list[tuple[str | None, Any, str]] = []
        if "spec" in meta or "named" not in meta:
            wanted.append((None, meta.get("spec"), "spec"))
        named = meta.get("named", {})
        if not isinstance(named, dict):
            self.fail(400, "SpecError", "runtime_env.named: expected a JSON object", field="named")
            return
        for name, entry in named.items():
            spec = entry.get("spec") if isinstance(entry, dict) else None
            wanted.append((name, spec, f"named.{name}.spec"))
        for _name, spec, field in wanted:
            if not isinstance(spec, dict):
                self.fail(
                    400, "SpecError", f"runtime_env.{field}: expected a JSON object", field=field
                )
                return
        path = data.get("path")
        if not isinstance(path, str):
            self.fail(400, "SpecError", "path: expected the notebook's path")
            return
        notebook_dir = self.notebook_dir(path, {})
        agent = await self.agent()
        rows = []
        for name, spec, field in wanted:
            row = await self._state_of(agent, spec, notebook_dir, field.removesuffix(".spec"))
            rows.append({"name": name, **row})
        default = rows[0] if rows and rows[0]["name"] is None else None
        worst = min(rows, key=lambda r: _WORST_FIRST.index(r["state"]))
        await self.reply(
            {
                "state": worst["state"],
                "env_id": (default or worst)["env_id"],
                "error": worst.get("error"),
                "default": default,
                "named": [r for r in rows if r["name"] is not None],
            }
        )

    async def _state_of(
        self, agent: Any, spec: dict[str, Any], notebook_dir: str, field: str
    ) -> dict[str, Any]:
        where = "" if field == "spec" else field
        parsed = await self.run(agent.parses.run(_parse_in, agent, spec, notebook_dir, where))
        want = _core(parsed.to_json())
        found: dict[str, Any] | None = None
        # Only envs with the same field names (plus the driver's) can match: their specs are
        # read, no others.
        names = set(want)
        envs, _total = await agent.summaries()
        for summary in envs:
            if set(summary.get("fields", [])) - set(DRIVER_FIELDS) != names:
                continue
            try:
                env = await agent.env_status(summary["env_id"])
            except EnvNotFound:
                continue
            if _core(env.get("spec") or {}) == want and (found is None or env["state"] == "READY"):
                found = env
        if found is None:
            return {"state": "missing", "env_id": None, "error": None}
        state = _STATE_OF_NOTEBOOK_ENV.get(found["state"], "failed")
        return {"state": state, "env_id": found["env_id"], "error": found.get("error")}


_GC_STATES = ("READY", "FAILED")


class UnreferencedHandler(PanelHandler):
    """The sidebar's GC: every environment nobody holds, shown first, then removed."""

    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """Envs nobody holds (READY or FAILED; building ones are held by their build), each
        with the bytes its removal frees (resources no held env uses), and the total."""
        agent = await self.agent()
        envs, _total = await agent.summaries()
        unheld = [e for e in envs if not e.get("holders") and e["state"] in _GC_STATES]
        held = {e["env_id"] for e in envs if e.get("holders")}
        freed = await asyncio.to_thread(
            _freed_bytes, agent.cache, [e["env_id"] for e in unheld], held
        )
        out = [
            {
                "env_id": e["env_id"],
                "state": e["state"],
                "bytes": freed["per_env"].get(e["env_id"], 0),
                "last_used": e.get("last_used") or e.get("updated"),
                "fields": e.get("fields", []),
            }
            for e in sorted(unheld, key=lambda e: e.get("last_used") or 0)
        ]
        await self.reply({"envs": out, "bytes": freed["total"], "held": len(held)})

    @web.authenticated
    @authorized
    @_handles_done
    async def post(self) -> None:
        """Remove the envs of ``{"env_ids": [...]}`` that nobody holds now; one taken since
        the list was shown is kept. Answers ``{"removed", "kept", "freed_bytes"}``."""
        data = await self.json_body()
        ids = data.get("env_ids") if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            self.fail(400, "ValueError", "env_ids: expected a list of env ids")
            return
        agent = await self.agent()
        sizes = await asyncio.to_thread(
            lambda: {r["uri"]: r["size"] or 0 for r in agent.cache.resources()}
        )
        removed: list[str] = []
        kept: list[str] = []
        freed = 0
        for env_id in dict.fromkeys(ids):
            if not is_env_id(env_id):
                kept.append(env_id[:80])
                continue
            try:
                env = await agent.env_status(env_id)
                if env.get("holders") or env["state"] not in _GC_STATES:
                    kept.append(env_id)
                    continue
                uris = await agent.remove(env_id)
            except (EnvNotFound, EnvInUse):  # gone meanwhile, or taken meanwhile
                kept.append(env_id)
                continue
            removed.append(env_id)
            freed += sum(sizes.get(u, 0) for u in uris)
        await self.reply({"removed": removed, "kept": kept, "freed_bytes": freed})


def _freed_bytes(cache: Any, env_ids: list[str], held: set[str]) -> dict[str, Any]:
    """Bytes removing ``env_ids`` frees: per env, and in all (each resource once); resources
    a held env uses stay. Blocking (the index): a thread."""
    sizes = {r["uri"]: r["size"] or 0 for r in cache.resources()}
    kept = {u for env_id in held for u in cache.env_uris(env_id)}
    per_env: dict[str, int] = {}
    every: set[str] = set()
    for env_id in env_ids:
        uris = [u for u in cache.env_uris(env_id) if u not in kept]
        per_env[env_id] = sum(sizes.get(u, 0) for u in uris)
        every.update(uris)
    return {"per_env": per_env, "total": sum(sizes.get(u, 0) for u in every)}


panel_handlers = [
    (rf"{API_PREFIX}/gc/unreferenced/?", UnreferencedHandler),
    (rf"{API_PREFIX}/overview/?", OverviewHandler),
    (rf"{API_PREFIX}/envs/(?P<env_id>[^/]+)/rebuild/?", RebuildHandler),
    (rf"{API_PREFIX}/kernels/?", KernelsHandler),
    (rf"{API_PREFIX}/kernels/{_KERNEL_ID}/?", KernelReportHandler),
    (rf"{API_PREFIX}/kernels/{_KERNEL_ID}/notebook_env/?", KernelNotebookEnvHandler),
    (rf"{API_PREFIX}/kernels/{_KERNEL_ID}/workers/(?P<pid>[0-9]{{1,10}})/?", WorkerHandler),
    (rf"{API_PREFIX}/notebook_env/?", NotebookEnvHandler),
]
