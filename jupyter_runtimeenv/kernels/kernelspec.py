"""Kernelspecs whose kernels start in a runtime environment.

``install_kernelspec`` backs ``jupyter runtimeenv kernelspec install NAME SPEC``: it parses the
spec now (a bad spec is refused at install, naming the field; relative paths in a spec file
become absolute, relative to the file) and writes a kernelspec that names the
``runtime-env-provisioner`` with the spec in its config.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from ..errors import SpecError
from ..spec import parse
from .provisioner import PROVISIONER_NAME

_IPYKERNEL = re.compile(r"^\s*ipykernel\b", re.IGNORECASE)
_NAME = re.compile(r"[a-z0-9._-]+", re.IGNORECASE)


def kernelspec_dict(
    spec: Mapping[str, Any], *, display_name: str, argv: list[str] | None = None
) -> dict[str, Any]:
    """The ``kernel.json`` of a Python kernel started by the provisioner in ``spec``."""
    return {
        "argv": argv or ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "metadata": {
            "debugger": True,
            "kernel_provisioner": {
                "provisioner_name": PROVISIONER_NAME,
                "config": {"runtime_env": dict(spec)},
            },
        },
    }


def with_ipykernel(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` (canonical form) with ``ipykernel`` among its packages when it is isolated.

    A layered env sees the server's ipykernel; an isolated one must install its own.
    """
    data = dict(spec)
    if not data.get("config", {}).get("isolated"):
        return data
    field = "uv" if "uv" in data and "pip" not in data else "pip"
    value = data.get(field) or {"packages": []}
    value = dict(value) if isinstance(value, Mapping) else {"packages": list(value)}
    packages = list(value.get("packages", []))
    if not any(isinstance(p, str) and _IPYKERNEL.match(p) for p in packages):
        packages.append("ipykernel")
    value["packages"] = packages
    data[field] = value
    return data


def install_kernelspec(
    name: str,
    spec: str | os.PathLike[str] | Mapping[str, Any],
    *,
    user: bool = True,
    prefix: str | None = None,
    display_name: str | None = None,
) -> str:
    """Install kernelspec ``name`` starting its kernel in ``spec`` (a mapping or a YAML/JSON
    file); returns the kernelspec's directory. ``SpecError`` for a bad spec or name."""
    if not _NAME.fullmatch(name):
        raise SpecError("", f"kernelspec name {name!r}: use letters, digits, '.', '_' and '-'")
    parsed = parse(spec if isinstance(spec, Mapping) else Path(spec))
    canonical = parse(with_ipykernel(parsed.to_json())).to_json()
    kernel = kernelspec_dict(canonical, display_name=display_name or f"Python ({name})")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(kernel, indent=1), encoding="utf-8")
        manager = KernelSpecManager()
        path: str = manager.install_kernel_spec(
            tmp, kernel_name=name, user=user and prefix is None, prefix=prefix
        )
    return path
