"""The base of the sidebar's handlers (``panel``, ``notebook_env``): what they need from the
extension and the helpers they share (notebook paths, the user's name, kernel ids)."""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any, Protocol

from tornado import web

from .handlers import SETTINGS_KEY, AgentHost, RuntimeEnvHandler
from .kernels import KernelReports

__all__ = ["PanelHandler", "PanelHost"]


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
