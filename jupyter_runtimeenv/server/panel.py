"""REST endpoints of the JupyterLab sidebar, next to the core API in ``handlers.py``.

| path | methods |
|---|---|
| ``overview`` | GET every env with size, last use and named holders, and every kernel's workers |
| ``envs/{env_id}/rebuild`` | POST: retry a failed env, or remove an unheld one and build it again |
| ``kernels`` | GET every kernel's last report |
| ``kernels/{kernel_id}`` | POST a kernel's report (its pools, its declared env); GET it |
| ``kernels/{kernel_id}/workers/{pid}`` | DELETE: stop one reported worker |
| ``gc/unreferenced`` | GET the envs nobody holds and the bytes each frees; POST: remove them |

and ``notebook_env.py``'s two routes (a notebook's carried envs and their locks).

Holders are named as a user knows them: ``kernel:<id>...`` becomes the notebook path of the
kernel's session (or ``kernel <id8>``), ``cli`` becomes ``CLI``, the magic's and pools' holders
say so. Everything that touches the cache or parses a spec runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import EnvInUse, EnvNotFound
from ..spec.ids import is_env_id
from .cluster_report import validate_full
from .handlers import (
    API_PREFIX,
    DEFAULT_HOLDER,
    _handles_done,
)
from .kernels import MAX_REPORT_BYTES, ReportError
from .notebook_env import KernelNotebookEnvHandler, NotebookEnvHandler
from .panel_base import PanelHandler

_KERNEL_ID = r"(?P<kernel_id>[0-9A-Za-z_-]{1,64})"
#: The overview reads the stored spec (for its brief) of this many most recently used envs;
#: the others show their field names only (``GET envs/{id}`` has the spec).
OVERVIEW_SPECS = 50
OVERVIEW_PAGE = 500
_KERNEL_HOLDER = re.compile(r"^kernel:(?P<id>[^/]+)(?:/(?P<rest>.*))?$")
#: The holder of a rebuild nobody else holds, for as long as the build runs.
REBUILD_HOLDER = "rebuild"


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
    if holder == "cli" or holder.startswith("cli:"):  # cli:<pid>: a `jupyter runtimeenv build`
        pid = holder[4:]
        return {"id": holder, "label": f"CLI (pid {pid})" if pid else "CLI", "kind": "cli"}
    if holder == DEFAULT_HOLDER:
        return {"id": holder, "label": "REST (user)", "kind": "user"}
    if holder == REBUILD_HOLDER:
        return {"id": holder, "label": "rebuild (sidebar)", "kind": "rebuild"}
    if holder.startswith("name:"):
        return {"id": holder, "label": f"env {holder[5:]}", "kind": "named"}
    if holder.startswith("pool:"):
        return {"id": holder, "label": "workers (script)", "kind": "pool"}
    return {"id": holder, "label": holder, "kind": "other"}


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


_GC_STATES = ("READY", "FAILED")


class UnreferencedHandler(PanelHandler):
    """The sidebar's GC: every environment nobody holds, shown first, then removed."""

    @web.authenticated
    @authorized
    @_handles_done
    async def get(self) -> None:
        """Envs nobody holds (READY or FAILED), each with the bytes its removal frees
        (resources no held env uses), and the total; how many stay: ``held``, and
        ``building`` (nobody holds them but their build runs)."""
        agent = await self.agent()
        envs, _total = await agent.summaries()
        unheld = [e for e in envs if not e.get("holders") and e["state"] in _GC_STATES]
        building = [e for e in envs if not e.get("holders") and e["state"] not in _GC_STATES]
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
        await self.reply(
            {"envs": out, "bytes": freed["total"], "held": len(held), "building": len(building)}
        )

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
