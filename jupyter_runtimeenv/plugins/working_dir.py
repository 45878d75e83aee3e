"""``working_dir``: a directory (local, a local ``.zip``, or an http(s) URL to a zip) that
becomes every worker's cwd and the first entry of its ``sys.path``.

Who calls it: ``spec.parse`` (``validate``, ``identity``) and the agent (``uris``,
``create``, ``modify_context``). A local directory is hashed after ``excludes`` and
``.gitignore`` and materialised from the per-file content store: an unchanged directory
costs only the hash, a changed one copies only the changed files (see ``_store``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..context import ContextBuilder
from . import _sources
from .base import BuildContext, RuntimeEnvPlugin

if TYPE_CHECKING:
    from ..spec import RuntimeEnvSpec

_KINDS = ("dir", "zip", "tar", "whl", "url")


class WorkingDirPlugin(RuntimeEnvPlugin):
    """``max_bytes`` caps a local directory after excludes (default: 500 MiB, or
    ``$JUPYTER_RUNTIMEENV_MAX_UPLOAD_BYTES``)."""

    name = "working_dir"
    # After py_modules (25): it inserts itself first on sys.path, ahead of them.
    priority = 30
    pure_context = True
    local_content = True
    description = "a directory, .zip or http(s) zip URL: the workers' cwd, first on sys.path"

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes

    def validate(self, value: Any) -> str:
        return _sources.normalize(value, "", kinds=_KINDS)

    def identity(self, value: Any, spec: RuntimeEnvSpec) -> Any:
        return self._digest(value, spec, recall=False)

    def refresh_identity(self, value: Any, spec: RuntimeEnvSpec, known: Any) -> Any:
        if _sources.kind_of(value) in ("url", "remote"):
            return known  # a URL names its content; a remote URI is looked at when parsed
        return self._digest(value, spec, recall=False)

    def uris(self, value: Any, spec: RuntimeEnvSpec) -> list[str]:
        # The digest the env id was made from: the resource built is that content.
        digest = spec.identity.get(self.name) or self._digest(value, spec, recall=True)
        return [_sources.env_uri(self.name, digest, spec.env_id)]

    def describe(self, uri: str, value: Any, spec: RuntimeEnvSpec) -> str:
        return f"working_dir: {_sources.label(value, _sources.uri_digest(uri))}"

    def _digest(self, value: str, spec: RuntimeEnvSpec, *, recall: bool) -> str:
        limit = _sources.max_bytes(self.max_bytes)
        return _sources.digest(
            value, spec.excludes, self.name, keep_name=False, limit=limit, recall=recall
        )

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        expected = _sources.uri_digest(uri)
        return await _sources.create(
            value,
            expected,
            build,
            keep_name=False,
            flatten=True,
            limit=_sources.max_bytes(self.max_bytes),
        )

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        path = ctx.resource_path(uris[0])
        ctx.cwd = path
        ctx.extra_paths.insert(0, path)
        _sources.guard_tree(ctx.env_vars, path)
