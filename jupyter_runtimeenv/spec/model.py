"""``RuntimeEnvSpec`` and ``RuntimeEnvConfig``: a parsed, frozen, canonical spec."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

#: Fields the spec handles itself; every other field belongs to a plugin.
CORE_FIELDS = ("config", "excludes", "plugins")


@dataclass(frozen=True)
class RuntimeEnvConfig:
    """How to build, not what: apart from ``isolated`` it does not change the env id."""

    #: Deadline of one build in seconds; ``None`` for none (Ray's ``-1``).
    setup_timeout_seconds: float | None = 600.0
    #: Build when the spec is declared (``%runtime_env``), not at the first task.
    eager_install: bool = True
    installer: Literal["uv", "pip"] = "uv"
    #: A bare venv instead of one layered over the driver's packages.
    isolated: bool = False
    #: Ray's ``log_files`` (files Ray's dashboard shows for the env): accepted, not surfaced.
    log_files: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "setup_timeout_seconds": self.setup_timeout_seconds,
            "eager_install": self.eager_install,
            "installer": self.installer,
            "isolated": self.isolated,
        }
        if self.log_files:
            data["log_files"] = list(self.log_files)
        return data


@dataclass(frozen=True)
class RuntimeEnvSpec:
    """A validated runtime environment spec. Build one with ``parse``.

    ``fields`` maps each field to its normalised value; ``plugins`` maps import paths of
    out-of-tree plugins to their config. ``env_id`` is the sha256 of the canonical identity:
    every field but ``config`` (only ``config.isolated`` counts), with local files entering by
    content. ``identity`` holds that identity per field (a ``working_dir``'s tree digest):
    a merge reuses it for fields that did not change, and ``refresh`` compares it with the
    files as they are now. It is not part of the spec's value (equality, JSON).
    """

    fields: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    plugins: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    config: RuntimeEnvConfig = field(default_factory=RuntimeEnvConfig)
    env_id: str = ""
    identity: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(sorted(self.fields.items()))))
        object.__setattr__(self, "plugins", MappingProxyType(dict(sorted(self.plugins.items()))))

    def __hash__(self) -> int:
        return hash((self.env_id, self.canonical_json()))

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    # Typed views of the well-known fields.
    @property
    def env_vars(self) -> dict[str, str]:
        return dict(self.fields.get("env_vars", {}))

    @property
    def excludes(self) -> list[str]:
        return list(self.fields.get("excludes", []))

    @property
    def driver_sys_path(self) -> bool | list[str]:
        value = self.fields.get("driver_sys_path", True)
        return list(value) if isinstance(value, list) else bool(value)

    def to_json(self) -> dict[str, Any]:
        """The canonical form: valid input to ``parse``, which gives the same spec back."""
        data: dict[str, Any] = {k: _thaw(v) for k, v in self.fields.items()}
        if self.plugins:
            data["plugins"] = {k: _thaw(v) for k, v in self.plugins.items()}
        data["config"] = self.config.to_json()
        return data

    def canonical_json(self) -> str:
        return canonical_dumps(self.to_json())

    def is_empty(self) -> bool:
        return not self.fields and not self.plugins


def canonical_dumps(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_of(data: Any) -> str:
    return hashlib.sha256(canonical_dumps(data).encode()).hexdigest()


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value
