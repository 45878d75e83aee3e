"""Finding plugins: the entry point group, or an import path given in a spec.

Built-in plugins are registered in the same entry point group as third-party ones, so both
load the same way.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from functools import cache

from ..errors import PluginNotFound
from ._entry_points import entry_points_of
from .base import RuntimeEnvPlugin

ENTRY_POINT_GROUP = "jupyter_runtimeenv.plugins"

__all__ = ["ENTRY_POINT_GROUP", "PluginRegistry", "default_registry", "load_plugin"]


def load_plugin(path: str, *, field: str = "plugins") -> RuntimeEnvPlugin:
    """Instantiate the plugin class at ``path`` (``pkg.mod.Class`` or ``pkg.mod:Class``).

    Whatever importing or constructing it raises, ``SystemExit`` included, comes back as a
    ``PluginNotFound`` naming ``field``: a plugin never ends the process that loads it. Only a
    ``KeyboardInterrupt`` in the main thread (a real Ctrl-C, in a CLI) passes.
    """
    module_name, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep or not module_name or not attr:
        raise PluginNotFound(field, f"{path!r} is not an import path like 'package.module.Class'")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:
        _reraise_interrupt(exc)
        raise PluginNotFound(
            field, f"cannot import plugin {path!r}: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        obj = getattr(module, attr)
    except BaseException as exc:
        _reraise_interrupt(exc)
        raise PluginNotFound(
            field, f"cannot import plugin {path!r}: {module_name} has no {attr!r}"
        ) from exc
    try:
        plugin = obj() if isinstance(obj, type) else obj
    except BaseException as exc:
        _reraise_interrupt(exc)
        raise PluginNotFound(
            field, f"cannot create plugin {path!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(plugin, RuntimeEnvPlugin):
        raise PluginNotFound(
            field, f"{path!r} is not a RuntimeEnvPlugin (got {type(plugin).__name__})"
        )
    return plugin


def _reraise_interrupt(exc: BaseException) -> None:
    # A real Ctrl-C is delivered to the main thread only; anywhere else (the server parses
    # in worker threads) a KeyboardInterrupt comes from the module itself.
    if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        raise exc


def _normal_path(path: str) -> str:
    return path.replace(":", ".")


class PluginRegistry:
    """The plugins one agent or parser may use.

    ``plugins`` are used as given (tests inject fakes this way); otherwise the entry point
    group is read. Which import paths a spec may name is the business of its ``SpecPolicy``,
    checked before ``by_path`` is asked.
    """

    def __init__(self, plugins: Iterable[RuntimeEnvPlugin] | None = None) -> None:
        self._by_field: dict[str, RuntimeEnvPlugin] = {}
        self._aliases: dict[str, str] = {}
        self._errors: dict[str, str] = {}
        #: Import paths (``a.b.C``) of the plugins of the entry point group.
        self._registered: dict[str, RuntimeEnvPlugin] = {}
        self._by_path: dict[str, RuntimeEnvPlugin] = {}
        #: Entry points not imported yet, field -> import path: a plugin is imported when a
        #: spec first uses its field (``%runtime_env --env-var`` in a fresh kernel imported
        #: all nine, pip's packaging among them: a third of its time).
        self._pending: dict[str, str] = {}
        self._lock = threading.Lock()
        self._loading = threading.RLock()
        if plugins is None:
            self._pending = entry_points_of(ENTRY_POINT_GROUP)
        else:
            for plugin in plugins:
                self.add(plugin)

    def _load(self, name: str) -> None:
        """Import the entry point of field ``name`` if it is still pending."""
        if name not in self._pending:
            return
        with self._loading:
            path = self._pending.get(name)
            if path is None:
                return
            try:
                plugin = load_plugin(path, field=name)
            except PluginNotFound as exc:
                # Remembered, reported when a spec uses the field: one broken third-party
                # plugin must not break every spec.
                self._errors[name] = exc.reason
            else:
                self.add(plugin, field=name)
                self._registered[_normal_path(path)] = plugin
            self._pending.pop(name, None)

    def _load_all(self) -> None:
        for name in list(self._pending):
            self._load(name)

    def add(self, plugin: RuntimeEnvPlugin, *, field: str | None = None) -> None:
        name = field or plugin.name
        if not name:
            raise PluginNotFound("plugins", f"{type(plugin).__name__} has no name")
        # A plugin added for a field replaces its entry point's, loaded or not.
        self._pending.pop(name, None)
        self._by_field[name] = plugin
        for alias in plugin.aliases:
            self._aliases[alias] = name

    def fields(self) -> list[str]:
        """The spec fields plugins claim, aliases included."""
        self._load_all()
        return sorted({*self._by_field, *self._aliases})

    def canonical_field(self, name: str) -> str:
        # An entry point's own name is a field; anything else may be an alias of a plugin
        # not imported yet (``uv`` is pip's), so every plugin is imported to know.
        if name not in self._aliases and name not in self._by_field and name not in self._pending:
            self._load_all()
        return self._aliases.get(name, name)

    def for_field(self, name: str) -> RuntimeEnvPlugin | None:
        field = self.canonical_field(name)
        self._load(field)
        return self._by_field.get(field)

    def broken(self, name: str) -> str | None:
        """Why the entry point registered for ``name`` failed to load, if it did."""
        self._load(name)
        return self._errors.get(name)

    def is_registered(self, path: str) -> bool:
        """Whether ``path`` is the import path of a plugin of the entry point group (or of
        one given to this registry): naming it imports nothing new."""
        if _normal_path(path) in self._registered:
            return True
        if any(_normal_path(path) == _normal_path(p) for p in list(self._pending.values())):
            return True
        return any(
            _normal_path(path) == f"{type(p).__module__}.{type(p).__qualname__}"
            for p in list(self._by_field.values())
        )

    def by_path(self, path: str) -> RuntimeEnvPlugin:
        """The plugin at import path ``path``, imported on first use (the caller's
        ``SpecPolicy`` decided it may be); ``PluginNotFound`` naming it otherwise."""
        field = f"plugins.{path}"
        for name, value in list(self._pending.items()):
            if _normal_path(value) == _normal_path(path):
                self._load(name)
        registered = self._registered.get(_normal_path(path))
        if registered is not None:
            return registered
        with self._lock:
            if path not in self._by_path:
                self._by_path[path] = load_plugin(path, field=field)
            return self._by_path[path]


@cache
def default_registry() -> PluginRegistry:
    """The registry of every installed plugin, loaded once per process."""
    return PluginRegistry()
