"""``py_modules``: local packages (or imported modules, as Ray takes), ``.py`` files, wheels,
zips, tars, URLs and remote URIs put on every worker's ``sys.path`` in the declared order.

Who calls it: ``spec.parse`` (``validate``, ``identity``) and the agent (``uris``,
``create``, ``modify_context``). Each module is its own resource, so two specs sharing a
module share its copy. A package directory ``mypkg`` is materialised as ``<resource>/mypkg``
(the resource's root goes on ``sys.path``); a wheel is installed into its resource with
``uv pip install --target --no-deps`` (its dependencies belong in the ``pip`` field); a zip
is unpacked as is (it should hold the package directory).
"""

from __future__ import annotations

import os
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..context import ContextBuilder
from ..errors import BuildError, SpecError
from . import _sources
from .base import BuildContext, RuntimeEnvPlugin

if TYPE_CHECKING:
    from ..spec import RuntimeEnvSpec

_KINDS = ("dir", "py", "zip", "tar", "whl", "url")


def _module_location(module: types.ModuleType, field: str) -> str:
    """Ray also takes imported modules: a package's directory, or a module's ``.py`` file."""
    file: str | None = getattr(module, "__file__", None)
    if not file:
        raise SpecError(field, f"module {module.__name__!r} has no file to ship (built in?)")
    if os.path.basename(file).startswith("__init__."):
        return os.path.dirname(os.path.abspath(file))
    if not file.endswith(".py"):
        raise SpecError(field, f"module {module.__name__!r} is {file}, not a .py file or package")
    return os.path.abspath(file)


class PyModulesPlugin(RuntimeEnvPlugin):
    name = "py_modules"
    # Before working_dir (30), which then puts itself ahead of the modules.
    priority = 25
    local_content = True
    description = "packages, .py files, wheels, zips or URLs to put on the workers' sys.path"

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes

    def validate(self, value: Any) -> list[str]:
        if not isinstance(value, list):
            raise SpecError("", f"expected a list of paths or URLs, got {type(value).__name__}")
        out: list[str] = []
        for i, item in enumerate(value):
            if isinstance(item, types.ModuleType):
                item = _module_location(item, str(i))
            location = _sources.normalize(item, str(i), kinds=_KINDS)
            if location not in out:
                out.append(location)
        return out

    def identity(self, value: Any, spec: RuntimeEnvSpec) -> Any:
        return self._digests(value, spec, recall=False)

    def refresh_identity(self, value: Any, spec: RuntimeEnvSpec, known: Any) -> Any:
        limit = _sources.max_bytes(self.max_bytes)
        now = []
        for i, location in enumerate(value):
            if _sources.kind_of(location) in ("url", "remote") and known:
                now.append(known[i])  # a URL names its content; a remote URI: at parse
            else:
                field = f"{self.name}.{i}"
                now.append(
                    _sources.digest(location, spec.excludes, field, keep_name=True, limit=limit)
                )
        return now

    def uris(self, value: Any, spec: RuntimeEnvSpec) -> list[str]:
        # The digests the env id was made from: the resources built are that content.
        digests = spec.identity.get(self.name) or self._digests(value, spec, recall=True)
        return [_sources.env_uri(self.name, d, spec.env_id) for d in digests]

    def describe(self, uri: str, value: Any, spec: RuntimeEnvSpec) -> str:
        digest = _sources.uri_digest(uri)
        digests = spec.identity.get(self.name) or self._digests(value, spec, recall=True)
        for location, known in zip(value, digests, strict=True):
            if known == digest:
                return f"py_modules: {_sources.label(location, digest)}"
        return super().describe(uri, value, spec)

    def _digests(self, value: list[str], spec: RuntimeEnvSpec, *, recall: bool) -> list[str]:
        limit = _sources.max_bytes(self.max_bytes)
        return [
            _sources.digest(
                loc, spec.excludes, f"{self.name}.{i}", keep_name=True, limit=limit, recall=recall
            )
            for i, loc in enumerate(value)
        ]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        expected = _sources.uri_digest(uri)
        # The agent asks for each URI separately; find which module this one is (two
        # modules with the same content share a URI: either builds it). Hashing blocks.
        known = build.spec.identity.get(self.name) or []
        location = next((loc for loc, d in zip(value, known, strict=False) if d == expected), None)
        if location is None:
            location = await build.to_thread(self._find, value, expected, build.spec.excludes)
        if location is None:
            raise BuildError(f"no module of this spec has the content {expected} any more")
        return await _sources.create(
            location,
            expected,
            build,
            keep_name=True,
            flatten=False,
            limit=_sources.max_bytes(self.max_bytes),
        )

    def _find(self, value: list[str], expected: str, excludes: list[str]) -> str | None:
        limit = _sources.max_bytes(self.max_bytes)
        for location in value:
            kind = _sources.kind_of(location)
            prefix = kind + ":" if kind in ("url", "remote", "zip", "tar", "whl") else "tree:"
            if not expected.startswith(prefix):
                continue
            try:
                found = _sources.digest(
                    location, excludes, self.name, keep_name=True, limit=limit, recall=True
                )
            except (OSError, SpecError):
                continue
            if found == expected:
                return location
        return None

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        paths = [ctx.resource_path(uri) for uri in uris]
        ctx.extra_paths[0:0] = [p for p in paths if p not in ctx.extra_paths]
        for path in paths:
            _sources.guard_tree(ctx.env_vars, path)
