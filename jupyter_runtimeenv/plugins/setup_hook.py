"""``worker_process_setup_hook`` (Ray's field): a function run once in every worker as it
starts, before any task: an import path (``"mypkg.setup.configure_logging"``) or a callable.

Who calls it: ``spec.parse`` (``validate``), the agent (``uris``, ``create``,
``modify_context``) and, in the worker, the bootstrap (``workers/_entry.py``), which runs the
hook after ``sys.path`` is set up and before it says HELLO. A hook that raises stops that
worker's start: the driver gets a ``WorkerSetupError`` naming the hook, with its traceback.

A callable is pickled by value with cloudpickle (also when it lives in an importable module,
so workers need not import the driver's module) and kept as a small resource file; its bytes
enter the env id, so a changed hook is a new environment.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..context import ContextBuilder
from ..errors import SpecError
from ..spec.policy import MAX_IMPORT_PATH
from .base import BuildContext, RuntimeEnvPlugin

#: What the bootstrap reads: JSON ``{"import": path}`` or ``{"pickle": file, "name": ...}``.
SETUP_HOOK_VAR = "JUPYTER_RUNTIMEENV_SETUP_HOOK"
# Full match, ASCII: with re.match, "$" also accepts a trailing newline ("pkg.f\n").
_IMPORT_PATH = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*[.:][A-Za-z_][A-Za-z0-9_]*"
)

__all__ = ["SETUP_HOOK_VAR", "SetupHookPlugin"]


def _pickle_by_value(func: Any) -> bytes:
    import cloudpickle

    module = sys.modules.get(getattr(func, "__module__", "") or "")
    by_value = (
        isinstance(func, types.FunctionType)
        and module is not None
        and module.__name__ != "__main__"
        and module.__name__ not in cloudpickle.list_registry_pickle_by_value()
    )
    if by_value:
        assert module is not None
        cloudpickle.register_pickle_by_value(module)
    try:
        data: bytes = cloudpickle.dumps(func)
    finally:
        if by_value:
            assert module is not None
            cloudpickle.unregister_pickle_by_value(module)
    return data


class SetupHookPlugin(RuntimeEnvPlugin):
    name = "worker_process_setup_hook"
    priority = 70
    description = "a function (or its import path) run once in each worker before any task"

    def validate(self, value: Any) -> str | dict[str, str]:
        if isinstance(value, str):
            if len(value) > MAX_IMPORT_PATH or not _IMPORT_PATH.fullmatch(value):
                shown = value if len(value) <= 80 else value[:77] + "..."
                raise SpecError(
                    "", f"{shown!r} is not an import path like 'package.module.function'"
                )
            return value
        if isinstance(value, dict) and set(value) == {"name", "pickled"}:
            return {"name": str(value["name"]), "pickled": str(value["pickled"])}  # canonical
        if callable(value):
            try:
                data = _pickle_by_value(value)
            except Exception as exc:
                raise SpecError("", f"the hook cannot be pickled: {exc}") from None
            name = getattr(value, "__qualname__", None) or type(value).__name__
            return {"name": name, "pickled": base64.b64encode(data).decode("ascii")}
        raise SpecError("", f"expected a callable or an import path, got {type(value).__name__}")

    def uris(self, value: Any, spec: Any) -> list[str]:
        if isinstance(value, str):
            return []
        return [f"setup_hook:{hashlib.sha256(value['pickled'].encode()).hexdigest()[:32]}"]

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        data = base64.b64decode(value["pickled"])
        await build.to_thread((build.target / "hook.pkl").write_bytes, data)
        return len(data)

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        if isinstance(value, str):
            ctx.env_vars[SETUP_HOOK_VAR] = json.dumps({"import": value})
            return
        path = str(Path(ctx.resource_path(uris[0])) / "hook.pkl")
        ctx.env_vars[SETUP_HOOK_VAR] = json.dumps({"pickle": path, "name": value["name"]})
