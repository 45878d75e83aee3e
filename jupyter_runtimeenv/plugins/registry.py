"""Finding plugins: the entry point group, or an import path given in a spec.

Built-in plugins are registered in the same entry point group as third-party ones, so both
load the same way.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from functools import cache
from importlib.metadata import entry_points

from ..errors import PluginNotFound
from .base import RuntimeEnvPlugin

ENTRY_POINT_GROUP = "jupyter_runtimeenv.plugins"

__all__ = ["ENTRY_POINT_GROUP", "PluginRegistry", "default_registry", "load_plugin"]


def load_plugin(path: str, *, field: str = "plugins") -> RuntimeEnvPlugin:
    """Instantiate the plugin class at ``path`` (``pkg.mod.Class`` or ``pkg.mod:Class``)."""
    module_name, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep or not module_name or not attr:
        raise PluginNotFound(field, f"{path!r} is not an import path like 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise PluginNotFound(
            field, f"cannot import plugin {path!r}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise PluginNotFound(
            field, f"cannot import plugin {path!r}: {module_name} has no {attr!r}"
        ) from exc
    plugin = obj() if isinstance(obj, type) else obj
    if not isinstance(plugin, RuntimeEnvPlugin):
        raise PluginNotFound(
            field, f"{path!r} is not a RuntimeEnvPlugin (got {type(plugin).__name__})"
        )
    return plugin


class PluginRegistry:
    """The plugins one agent or parser may use.

    ``plugins`` are used as given (tests inject fakes this way); otherwise the entry point
    group is read. ``allowed`` limits which import paths a spec's ``plugins`` field may name
    (``None``: any).
    """

    def __init__(
        self,
        plugins: Iterable[RuntimeEnvPlugin] | None = None,
        *,
        allowed: Iterable[str] | None = None,
    ) -> None:
        self._by_field: dict[str, RuntimeEnvPlugin] = {}
        self._aliases: dict[str, str] = {}
        self._errors: dict[str, str] = {}
        self.allowed = None if allowed is None else frozenset(allowed)
        self._by_path: dict[str, RuntimeEnvPlugin] = {}
        self._lock = threading.Lock()
        if plugins is None:
            self._load_entry_points()
        else:
            for plugin in plugins:
                self.add(plugin)

    def _load_entry_points(self) -> None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                plugin = load_plugin(ep.value, field=ep.name)
            except PluginNotFound as exc:
                # Remembered, reported when a spec uses the field: one broken third-party
                # plugin must not break every spec.
                self._errors[ep.name] = exc.reason
                continue
            self.add(plugin, field=ep.name)

    def add(self, plugin: RuntimeEnvPlugin, *, field: str | None = None) -> None:
        name = field or plugin.name
        if not name:
            raise PluginNotFound("plugins", f"{type(plugin).__name__} has no name")
        self._by_field[name] = plugin
        for alias in plugin.aliases:
            self._aliases[alias] = name

    def fields(self) -> list[str]:
        """The spec fields plugins claim, aliases included."""
        return sorted({*self._by_field, *self._aliases})

    def canonical_field(self, name: str) -> str:
        return self._aliases.get(name, name)

    def for_field(self, name: str) -> RuntimeEnvPlugin | None:
        return self._by_field.get(self.canonical_field(name))

    def broken(self, name: str) -> str | None:
        """Why the entry point registered for ``name`` failed to load, if it did."""
        return self._errors.get(name)

    def by_path(self, path: str) -> RuntimeEnvPlugin:
        """The plugin at import path ``path``; ``PluginNotFound`` naming it otherwise."""
        field = f"plugins.{path}"
        if self.allowed is not None and path not in self.allowed:
            allowed = ", ".join(sorted(self.allowed)) or "none"
            raise PluginNotFound(field, f"plugin {path!r} is not allowed here (allowed: {allowed})")
        with self._lock:
            if path not in self._by_path:
                self._by_path[path] = load_plugin(path, field=field)
            return self._by_path[path]


@cache
def default_registry() -> PluginRegistry:
    """The registry of every installed plugin, loaded once per process."""
    return PluginRegistry()
