"""A notebook's carried envs on the server's side: ``metadata.runtime_env`` (``notebook_meta``).

| path | methods |
|---|---|
| ``kernels/{kernel_id}/notebook_env`` | GET the kernel's declared envs as notebook metadata |
| ``notebook_env`` | POST a notebook's ``metadata.runtime_env``: the state of its envs |

Saving (the GET) gives each env with pip/uv packages ``"lock"``: the ``pylock.toml`` of the
env as this server built it (``locks``). The badge's POST says, for each env, whether this
server has it and, for an env with a lock, how the env that runs it (the one the notebook's
kernel declared under that name, else the one this server has for the spec) differs from the
lock: which packages, which versions. uv runs as a subprocess (never on the event loop);
specs are parsed and venvs read in threads.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import EnvNotFound, RuntimeEnvError, SpecError
from ..locks import (
    differences,
    env_versions,
    lock_of_env,
    locked_spec,
    locked_versions,
    pip_field,
)
from ..notebook_meta import DRIVER_FIELDS, notebook_metadata
from ..spec.paths import base_dir
from .handlers import _handles_done
from .panel_base import PanelHandler

__all__ = ["KernelNotebookEnvHandler", "NotebookEnvHandler", "add_locks", "compare"]

log = logging.getLogger(__name__)
_STATE_OF_NOTEBOOK_ENV = {"READY": "cached", "BUILDING": "building", "PENDING": "building"}


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
        await add_locks(agent, meta)  # the versions each env has, for Declare elsewhere
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
        metadata, "kernel_id": optional}``; answers ``{"state", "env_id", "error", "default",
        "named": [...], "lock_differences"}``, each entry ``{"name", "state":
        cached|building|failed|missing, "env_id", "error", "lock", "lock_differences"}`` and
        ``state`` the worst of them. An env matches when its spec, without the driver's own
        fields, is the metadata's spec (pinned to its ``lock`` first, as Declare installs it,
        then as written, as ``--upgrade`` does) resolved against the notebook's directory;
        ``env_id`` is that env's (the id the kernel shows), ``null`` when this server has
        none. An env with a lock is compared with the env the kernel ``kernel_id`` declared
        under its name (else the matched one): ``lock`` is matches|differs|unchecked."""
        data = await self.json_body()
        if not isinstance(data, dict) or not isinstance(data.get("runtime_env"), dict):
            self.fail(400, "SpecError", "runtime_env: expected the notebook's metadata object")
            return
        meta = data["runtime_env"]
        wanted: list[tuple[str | None, Any, str, Any]] = []
        if "spec" in meta or "named" not in meta:
            wanted.append((None, meta.get("spec"), "spec", meta.get("lock")))
        named = meta.get("named", {})
        if not isinstance(named, dict):
            self.fail(400, "SpecError", "runtime_env.named: expected a JSON object", field="named")
            return
        for name, entry in named.items():
            entry = entry if isinstance(entry, dict) else {}
            wanted.append((name, entry.get("spec"), f"named.{name}.spec", entry.get("lock")))
        for _name, spec, field, lock in wanted:
            if not isinstance(spec, dict):
                self.fail(
                    400, "SpecError", f"runtime_env.{field}: expected a JSON object", field=field
                )
                return
            lock_field = field.removesuffix("spec") + "lock"
            if lock is not None and not isinstance(lock, str):
                self.fail(
                    400,
                    "SpecError",
                    f"runtime_env.{lock_field}: expected the text of a pylock.toml",
                    field=lock_field,
                )
                return
        path = data.get("path")
        if not isinstance(path, str):
            self.fail(400, "SpecError", "path: expected the notebook's path")
            return
        notebook_dir = self.notebook_dir(path, {})
        running = self._declared_ids(data.get("kernel_id"))
        agent = await self.agent()
        rows = []
        for name, spec, field, lock in wanted:
            where = field.removesuffix(".spec")
            lock_field = field.removesuffix("spec") + "lock"
            forms = [spec]
            if lock is not None:
                pinned = asyncio.to_thread(locked_spec, spec, lock, lock_field)
                forms.insert(0, await self.run(pinned))
            for form in forms:
                row = await self._state_of(agent, form, notebook_dir, where)
                if row["state"] != "missing":
                    break
            if lock is not None:
                env_id = running.get(name, row["env_id"])
                row.update(await self.run(compare(agent, lock, lock_field, env_id)))
            rows.append({"name": name, **row})
        default = rows[0] if rows and rows[0]["name"] is None else None
        worst = min(rows, key=lambda r: _WORST_FIRST.index(r["state"]))
        lines = [
            line if r["name"] is None else f"{r['name']}: {line}"
            for r in rows
            for line in r.get("lock_differences", [])
        ]
        await self.reply(
            {
                "state": worst["state"],
                "env_id": (default or worst)["env_id"],
                "error": worst.get("error"),
                "default": default,
                "named": [r for r in rows if r["name"] is not None],
                "lock_differences": lines,
            }
        )

    def _declared_ids(self, kernel_id: Any) -> dict[str | None, str]:
        """``{name: env_id}`` the kernel ``kernel_id`` declared (its last report), or ``{}``."""
        if not isinstance(kernel_id, str):
            return {}
        report = self.panel_host.kernel_reports.get(kernel_id) or {}
        return {
            d.get("name"): d["env_id"]
            for d in report.get("declared", [])
            if isinstance(d, dict) and isinstance(d.get("env_id"), str)
        }

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


async def env_python(agent: Any, env_id: str | None) -> tuple[str, dict[str, Any]] | None:
    """The python of READY env ``env_id`` on this server and its stored spec, or ``None``."""
    if not env_id:
        return None
    try:
        env = await agent.env_status(env_id)
    except (EnvNotFound, RuntimeEnvError, ValueError):
        return None
    context = env.get("context") or {}
    python = context.get("python")
    if env.get("state") != "READY" or not isinstance(python, str):
        return None
    return python, env.get("spec") or {}


async def add_locks(agent: Any, meta: dict[str, Any]) -> None:
    """Each of ``meta``'s envs (the default, ``named``'s) with pip/uv packages and an
    ``env_id`` READY here gets ``lock``: uv's ``pylock.toml`` of its venv. One uv cannot
    lock (an index out of reach) gets ``lock_error`` instead, uv's reason."""
    from ..plugins._uv import installer_env, uv_bin

    entries = [meta] if "spec" in meta else []
    entries += list(meta.get("named", {}).values())
    for entry in entries:
        if pip_field(entry.get("spec") or {}) is None:
            continue
        found = await env_python(agent, entry.get("env_id"))
        if found is None:
            continue
        python, spec = found
        field = pip_field(spec)
        value = spec.get(field) if field else None
        options = value.get("install_options", []) if isinstance(value, dict) else []
        env = installer_env(agent.cache.root)
        try:
            entry["lock"] = await lock_of_env(python, options, env, uv_bin())
        except RuntimeEnvError as exc:
            # Saved without a lock; the sidebar says why (and does not store this key).
            log.warning("runtime env %s saved without a lock: %s", entry.get("env_id"), exc)
            entry["lock_error"] = str(exc)


async def compare(agent: Any, lock: str, where: str, env_id: str | None) -> dict[str, Any]:
    """``{"lock": "matches"|"differs"|"unchecked", "lock_differences": [...]}`` of the lock
    text ``lock`` against env ``env_id`` (``unchecked``: no such READY env here)."""
    versions = locked_versions(lock, where)
    found = await env_python(agent, env_id)
    if found is None:
        return {"lock": "unchecked", "lock_differences": []}
    installed = await asyncio.to_thread(env_versions, found[0])
    lines = differences(versions, installed)
    return {"lock": "differs" if lines else "matches", "lock_differences": lines}
