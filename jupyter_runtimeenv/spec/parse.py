"""``parse``: a dict, or a YAML/JSON file, into a ``RuntimeEnvSpec`` (or a ``SpecError``)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import CacheUnavailable, SpecError
from ..plugins.base import RuntimeEnvPlugin
from ..plugins.registry import ENTRY_POINT_GROUP, PluginRegistry, default_registry
from . import files
from .model import CORE_FIELDS, RuntimeEnvConfig, RuntimeEnvSpec, sha256_of
from .paths import base_dir
from .patterns import MAX_PATTERN_CHARS, MAX_PATTERNS
from .policy import SpecPolicy, applying, current_policy
from .ray import RAY_INTERNAL, check_ray_form, ray_only_reason
from .strict_json import loads_strict

__all__ = ["load_spec_file", "merge", "parse", "refresh"]


def parse(
    data: RuntimeEnvSpec | Mapping[str, Any] | str | os.PathLike[str] | None,
    *,
    registry: PluginRegistry | None = None,
    policy: SpecPolicy | None = None,
    reuse: Sequence[RuntimeEnvSpec] = (),
) -> RuntimeEnvSpec:
    """Validate ``data`` into a frozen spec.

    ``data`` is a mapping with Ray-compatible fields, a path to a YAML or JSON file (relative
    paths inside it are relative to the file), ``None`` (the empty spec), or a spec (returned
    as is). Each plugin validates its own field. Refusals raise ``SpecError`` whose ``field``
    is the dotted path of the offending value. ``policy`` says what the spec's sender may ask
    for (default: the policy in effect, ``TRUSTED`` unless an agent set another); it is
    applied before any plugin is imported. Parsing may read local files (hashing
    ``working_dir``): call it in a thread from an event loop. ``reuse``: specs whose field
    identities may stand for equal fields of this one (see ``merge``).
    """
    if isinstance(data, RuntimeEnvSpec):
        return data
    policy = policy or current_policy()
    registry = registry or default_registry()
    if data is None:
        data = {}
    with applying(policy):
        if isinstance(data, (str, os.PathLike)):
            path = Path(data)
            with base_dir(str(path.resolve().parent)):
                return _parse_mapping(load_spec_file(path), registry, policy, reuse)
        if not isinstance(data, Mapping):
            raise SpecError(
                "", f"expected a mapping of fields or a file path, got {type(data).__name__}"
            )
        return _parse_mapping(data, registry, policy, reuse)


def check_plain(data: Any, max_depth: int) -> None:
    """Refuse what no field accepts, wherever it is: nesting deeper than ``max_depth``,
    numbers that are not finite (``NaN``, ``Infinity``, ``1e400``), strings with a NUL.

    Iterative, so that hostile nesting cannot exhaust the recursion limit here.
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(where, f"numbers must be finite, got {value!r}")
        if isinstance(value, str) and "\0" in value:
            raise SpecError(where, "a string cannot contain a NUL character")
        if isinstance(value, (Mapping, list, tuple)):
            if depth >= max_depth:
                raise SpecError(where, f"nested deeper than {max_depth} levels")
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and "\0" in key:
                    raise SpecError(where, "a key cannot contain a NUL character")
                if isinstance(key, float) and not math.isfinite(key):
                    raise SpecError(where, f"numbers must be finite, got {key!r}")
                name = str(key)[:100]
                stack.append((item, f"{where}.{name}" if where else name, depth + 1))


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load``, its errors as ``ValueError``. yaml is imported here: an inline or
    JSON spec (the CLI's, a kernel's) never needs it, and it is 10-20 ms of every start."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from exc


def load_spec_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML or JSON spec file; ``SpecError`` naming the file otherwise."""
    try:
        text = files.read_text(str(path), what="spec file")
    except files.BadFile as exc:
        raise SpecError("", str(exc)) from None
    try:
        loaded = loads_strict(text) if path.suffix == ".json" else _load_yaml(text)
    except RecursionError:
        raise SpecError("", f"{str(path)!r} is nested too deeply") from None
    except ValueError as exc:
        raise SpecError(
            "", f"{str(path)!r} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"
        ) from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SpecError(
            "", f"{str(path)!r} must hold a mapping of fields, not {type(loaded).__name__}"
        )
    return loaded


def _parse_mapping(
    data: Mapping[str, Any],
    registry: PluginRegistry,
    policy: SpecPolicy,
    reuse: Sequence[RuntimeEnvSpec] = (),
) -> RuntimeEnvSpec:
    check_plain(data, policy.max_depth)
    for key in data:
        if not isinstance(key, str):
            raise SpecError(str(key), "field names must be strings")
    config = _parse_config(data.get("config", {}))
    raw_excludes = data.get("excludes")
    excludes = _parse_excludes(raw_excludes) if raw_excludes is not None else None

    fields: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in data.items():
        if key in CORE_FIELDS or key in RAY_INTERNAL:
            continue
        plugin = registry.for_field(key)
        if plugin is None:
            raise SpecError(key, ray_only_reason(key) or _unknown_field(key, registry))
        name = registry.canonical_field(key)
        if name in given_as:
            raise SpecError(key, f"{given_as[name]!r} and {key!r} are the same field; give one")
        given_as[name] = key
        if value is None:
            continue  # Ray treats a null field as absent
        check_ray_form(key, value)
        normal = _call_plugin(plugin.validate, key, value)
        if not plugin.is_empty(normal):
            fields[name] = normal
    for name in fields:
        plugin = registry.for_field(name)
        assert plugin is not None
        for other in plugin.conflicts:
            if other in fields:
                raise SpecError(
                    given_as[name], f"cannot be combined with {given_as[other]!r} (as in Ray)"
                )
    if excludes:
        fields["excludes"] = excludes

    plugins: dict[str, Any] = {}
    raw_plugins = data.get("plugins") or {}
    if not isinstance(raw_plugins, Mapping):
        raise SpecError(
            "plugins",
            f"expected a mapping of import paths to config, got {type(raw_plugins).__name__}",
        )
    for path in raw_plugins:
        # Every path is judged before the first is imported.
        policy.check_plugin(str(path), registered=registry.is_registered(str(path)))
    for path, plugin_config in raw_plugins.items():
        plugin = registry.by_path(str(path))
        plugins[str(path)] = _call_plugin(plugin.validate, f"plugins.{path}", plugin_config)

    spec = RuntimeEnvSpec(fields=fields, plugins=plugins, config=config)
    return _identified(spec, _identity(spec, registry, reuse))


def _identified(spec: RuntimeEnvSpec, identity: dict[str, Any]) -> RuntimeEnvSpec:
    return RuntimeEnvSpec(
        fields=spec.fields,
        plugins=spec.plugins,
        config=spec.config,
        env_id=sha256_of(identity),
        identity=MappingProxyType(identity),
    )


def _identity(
    spec: RuntimeEnvSpec, registry: PluginRegistry, reuse: Sequence[RuntimeEnvSpec] = ()
) -> dict[str, Any]:
    """Each field's identity. A field whose value is the same in a spec of ``reuse`` (with
    the same ``excludes`` and ``config``, all a plugin's identity may read besides its
    value) takes that spec's identity: a merge never walks an unchanged tree again."""
    known = [
        r for r in reuse if r.identity and r.excludes == spec.excludes and r.config == spec.config
    ]
    identity: dict[str, Any] = {}
    for key, value, plugin in _plugins_of(spec, registry):
        earlier = [r.identity[key] for r in known if key in r.identity and _value(r, key) == value]
        if earlier:
            identity[key] = earlier[0]
        elif plugin is None:
            identity[key] = value
        else:
            identity[key] = _call_plugin(plugin.identity, key, value, spec, nest=False)
    identity["config.isolated"] = spec.config.isolated
    return identity


def _plugins_of(
    spec: RuntimeEnvSpec, registry: PluginRegistry
) -> list[tuple[str, Any, RuntimeEnvPlugin | None]]:
    """(identity key, value, plugin) of every field and out-of-tree plugin of ``spec``."""
    out: list[tuple[str, Any, RuntimeEnvPlugin | None]] = [
        (name, value, registry.for_field(name)) for name, value in spec.fields.items()
    ]
    out += [(f"plugins.{p}", v, registry.by_path(p)) for p, v in spec.plugins.items()]
    return out


def _value(spec: RuntimeEnvSpec, key: str) -> Any:
    if key.startswith("plugins."):
        return spec.plugins.get(key[len("plugins.") :], _ABSENT)
    return spec.fields.get(key, _ABSENT)


_ABSENT = object()


def has_local_content(spec: RuntimeEnvSpec, registry: PluginRegistry | None = None) -> bool:
    """Whether ``refresh`` may ever give another spec for ``spec``: it has plugins or a field
    whose plugin has ``local_content``. The same answer for the same spec, always (an
    executor asks once per spec, not at every call)."""
    if spec.plugins:
        return True
    registry = registry or default_registry()
    return any(getattr(registry.for_field(name), "local_content", False) for name in spec.fields)


def refresh(spec: RuntimeEnvSpec, *, registry: PluginRegistry | None = None) -> RuntimeEnvSpec:
    """``spec`` with the content its local files have now: ``spec`` itself when nothing
    changed, else the same fields under a new env id.

    Who calls it: the executors, at every call, so that an edit to a module of a
    ``working_dir`` is seen by the next call. Only fields whose plugin has
    ``local_content`` are looked at again (a stat walk, from the stat cache); a source that
    is gone (a driver may delete a directory it has already shipped) keeps its identity.
    Blocking.
    """
    if not spec.identity:
        return spec
    registry = registry or default_registry()
    if not has_local_content(spec, registry):
        return spec  # the common case of a call without local code: no work at all
    identity = dict(spec.identity)
    for key, value, plugin in _plugins_of(spec, registry):
        if plugin is None or not plugin.local_content:
            continue
        try:
            identity[key] = plugin.refresh_identity(value, spec, identity.get(key))
        except (SpecError, OSError):
            continue  # gone or unreadable now: the content the env was made from stands
    if identity == spec.identity:
        return spec
    return _identified(spec, identity)


def _call_plugin(method: Callable[..., Any], field: str, *args: Any, nest: bool = True) -> Any:
    """A plugin's ``validate`` (its ``SpecError`` nested under ``field``) or ``identity``
    (``nest=False``: its errors name whole fields already); ``CacheUnavailable`` (a full
    cache disk under a tree stored while it is hashed) as it is; any other failure (a plugin
    bug, a path with a NUL byte) is a ``SpecError`` naming ``field``."""
    try:
        return method(*args)
    except SpecError as exc:
        raise (exc.within(field) if nest else exc) from None
    except CacheUnavailable:
        raise  # the cache's disk (a tree stored while hashed), not the spec
    except Exception as exc:
        raise SpecError(field, f"refused: {type(exc).__name__}: {exc}") from exc


def _unknown_field(key: str, registry: PluginRegistry) -> str:
    broken = registry.broken(key)
    if broken:
        return f"the plugin registered for this field failed to load: {broken}"
    known = sorted({*CORE_FIELDS, *registry.fields()})
    message = f"unknown field; known fields are {', '.join(known)}"
    import difflib  # for an unknown field's suggestion only

    close = difflib.get_close_matches(key, known, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return (
        message + f"; a plugin can claim it through the entry point group {ENTRY_POINT_GROUP!r}, "
        "or be named by import path under 'plugins'"
    )


_CONFIG_KEYS = ("setup_timeout_seconds", "eager_install", "installer", "isolated", "log_files")


def _parse_config(value: Any) -> RuntimeEnvConfig:
    if value is None:
        return RuntimeEnvConfig()
    if not isinstance(value, Mapping):
        raise SpecError("config", f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in _CONFIG_KEYS:
            raise SpecError(
                f"config.{key}", f"unknown config key; known keys are {', '.join(_CONFIG_KEYS)}"
            )
    timeout: float | None = 600.0
    if "setup_timeout_seconds" in value:
        raw = value["setup_timeout_seconds"]
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, (int, float))):
            raise SpecError(
                "config.setup_timeout_seconds",
                f"expected a number of seconds, got {type(raw).__name__}",
            )
        if raw is not None and not math.isfinite(raw):
            raise SpecError("config.setup_timeout_seconds", f"expected a finite number, got {raw}")
        if isinstance(raw, float) and not raw.is_integer():
            raise SpecError(
                "config.setup_timeout_seconds",
                f"expected a whole number of seconds (as in Ray), got {raw}",
            )
        if raw == -1 or raw is None:
            timeout = None
        elif raw <= 0:
            raise SpecError(
                "config.setup_timeout_seconds",
                f"expected a positive number or -1 for no deadline, got {raw}",
            )
        else:
            timeout = float(raw)
    flags = {}
    for key in ("eager_install", "isolated"):
        if key in value and not isinstance(value[key], bool):
            raise SpecError(
                f"config.{key}", f"expected true or false, got {type(value[key]).__name__}"
            )
        flags[key] = bool(value.get(key, key == "eager_install"))
    installer = value.get("installer", "uv")
    if installer not in ("uv", "pip"):
        raise SpecError("config.installer", f"expected 'uv' or 'pip', got {installer!r}")
    log_files = value.get("log_files") or []
    if not isinstance(log_files, list) or not all(isinstance(f, str) and f for f in log_files):
        raise SpecError("config.log_files", "expected a list of file paths (Ray's log_files)")
    return RuntimeEnvConfig(
        setup_timeout_seconds=timeout,
        eager_install=flags["eager_install"],
        installer=installer,
        isolated=flags["isolated"],
        log_files=tuple(log_files),
    )


def _parse_excludes(value: Any) -> list[str]:
    # Bounded here, before any tree is walked: patterns are matched against every file of
    # working_dir/py_modules (in linear time, see ``patterns``), so their number and length
    # bound the work of a request.
    if not isinstance(value, list):
        raise SpecError(
            "excludes", f"expected a list of gitignore-style patterns, got {type(value).__name__}"
        )
    if len(value) > MAX_PATTERNS:
        raise SpecError("excludes", f"{len(value)} patterns; at most {MAX_PATTERNS} are accepted")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise SpecError(
                f"excludes.{i}", f"expected a non-empty pattern string, got {_short(item)}"
            )
        if len(item) > MAX_PATTERN_CHARS:
            raise SpecError(
                f"excludes.{i}",
                f"a pattern of {len(item)} characters; at most {MAX_PATTERN_CHARS} are accepted",
            )
    return list(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def merge(
    base: RuntimeEnvSpec | Mapping[str, Any] | None,
    override: RuntimeEnvSpec | Mapping[str, Any] | None,
    *,
    registry: PluginRegistry | None = None,
) -> RuntimeEnvSpec:
    """``override`` on top of ``base``: key by key; ``env_vars``, ``config`` and ``plugins``
    merge per entry. A ``None`` value in ``override`` removes the key."""
    registry = registry or default_registry()
    # Nothing to merge: the parsed spec as it is (its local paths are not checked again,
    # so a driver may delete a working_dir it has already shipped to a cluster).
    if override is None and isinstance(base, RuntimeEnvSpec):
        return base
    if base is None and isinstance(override, RuntimeEnvSpec):
        return override
    left = _as_dict(base, registry)
    right = _as_dict(override, registry)
    merged = dict(left)
    for key, value in right.items():
        if value is None:
            merged.pop(key, None)
        elif (
            key in ("env_vars", "config", "plugins")
            and isinstance(value, Mapping)
            and isinstance(merged.get(key), Mapping)
        ):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    for key in [k for k, v in right.items() if v is not None]:
        plugin = registry.for_field(key)
        for other in plugin.conflicts if plugin else ():
            if other not in right:
                merged.pop(other, None)  # a per-call pip replaces the session's conda
    # Fields that did not change keep their identity: no tree is walked again here.
    reuse = [s for s in (override, base) if isinstance(s, RuntimeEnvSpec)]
    return parse(merged, registry=registry, reuse=reuse)


def _as_dict(
    spec: RuntimeEnvSpec | Mapping[str, Any] | None, registry: PluginRegistry
) -> dict[str, Any]:
    if spec is None:
        return {}
    data = spec.to_json() if isinstance(spec, RuntimeEnvSpec) else dict(spec)
    return {registry.canonical_field(k) if k not in CORE_FIELDS else k: v for k, v in data.items()}
