"""Kernelspecs whose kernels start in a runtime environment.

``install_kernelspec`` backs ``jupyter runtimeenv kernelspec install NAME SPEC``: it parses the
spec now (a bad spec is refused at install, naming the field; relative paths in a spec file
become absolute, relative to the file) and writes a kernelspec that names the
``runtime-env-provisioner`` with the spec in its config. With ``dask=ADDRESS`` (``--dask``)
the kernelspec names the ``runtime-env-dask-provisioner`` instead, with the scheduler's
address (and the nodes' cache dir) next to the spec: its kernels run on a node of that
cluster, and the Launcher shows it as ``NAME (cluster)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

from ..errors import SpecError
from ..spec import parse
from .provisioner import PROVISIONER_NAME
from .remote import PROVISIONER_NAME as DASK_PROVISIONER_NAME

_IPYKERNEL = re.compile(r"^\s*ipykernel\b", re.IGNORECASE)
_NAME = re.compile(r"[a-z0-9._-]+", re.IGNORECASE)
#: A Dask address: protocol://host:port (host may be a name, an IPv4 or a [bracketed] IPv6).
_SCHEDULER = re.compile(r"(tcp|tls|ws|wss|ucx)://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}")


def kernelspec_dict(
    spec: Mapping[str, Any],
    *,
    display_name: str,
    argv: list[str] | None = None,
    dask: str | None = None,
    node_cache_dir: str | None = None,
) -> dict[str, Any]:
    """The ``kernel.json`` of a Python kernel started by the provisioner in ``spec`` (on a
    node of the Dask cluster at ``dask`` when given)."""
    config: dict[str, Any] = {"runtime_env": dict(spec)}
    if dask:
        config["scheduler"] = dask
        if node_cache_dir:
            config["node_cache_dir"] = node_cache_dir
    return {
        "argv": argv or ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "metadata": {
            # The debugger needs the kernel's files on the server's disk: not on a node.
            "debugger": not dask,
            # A kernel on a node can have CurveZMQ keys (ipykernel >= 7 uses them) when the
            # kernel manager's transport_encryption asks: its traffic crosses a network.
            **({"supported_encryption": ["curve"]} if dask else {}),
            "kernel_provisioner": {
                "provisioner_name": DASK_PROVISIONER_NAME if dask else PROVISIONER_NAME,
                "config": config,
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
    dask: str | None = None,
    node_cache_dir: str | None = None,
) -> str:
    """Install kernelspec ``name`` starting its kernel in ``spec`` (a mapping or a YAML/JSON
    file); returns the kernelspec's directory. ``SpecError`` for a bad spec or name.

    ``dask``: a Dask scheduler's address (``tcp://host:port``): the kernel starts on a node
    of that cluster, in the env built there; ``node_cache_dir`` sets the nodes' cache root
    (formatted with the Dask worker's ``name`` and ``id``). Its display name ends in
    `` (cluster)``.
    """
    if not _NAME.fullmatch(name):
        raise SpecError("", f"kernelspec name {name!r}: use letters, digits, '.', '_' and '-'")
    if dask is not None and not _SCHEDULER.fullmatch(dask):
        raise SpecError(
            "", f"--dask {dask!r}: expected a Dask scheduler address like tcp://host:8786"
        )
    if node_cache_dir is not None and dask is None:
        raise SpecError("", "--node-cache-dir needs --dask (it is the cluster nodes' cache)")
    if node_cache_dir is not None:
        _check_template(node_cache_dir)
    parsed = parse(spec if isinstance(spec, Mapping) else Path(spec))
    canonical = parse(with_ipykernel(parsed.to_json())).to_json()
    title = f"{display_name or name} (cluster)" if dask else display_name or f"Python ({name})"
    kernel = kernelspec_dict(
        canonical, display_name=title, dask=dask, node_cache_dir=node_cache_dir
    )
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kernel.json").write_text(json.dumps(kernel, indent=1), encoding="utf-8")
        _copy_logos(Path(tmp))
        manager = KernelSpecManager()
        path: str = manager.install_kernel_spec(
            tmp, kernel_name=name, user=user and prefix is None, prefix=prefix
        )
    return path


def _copy_logos(directory: Path) -> None:
    """Python's logos, as ipykernel's own kernelspec has them, for the Launcher's card."""
    try:
        from ipykernel.kernelspec import RESOURCES
    except ImportError:  # the Launcher shows the name's first letter instead
        return
    for logo in Path(RESOURCES).glob("logo-*"):
        shutil.copyfile(logo, directory / logo.name)


def _check_template(template: str) -> None:
    """``--node-cache-dir`` may use ``{name}`` and ``{id}`` only, and must be absolute (it is
    a path on every node, not here)."""
    try:
        template.format(name="n", id="i")
    except (KeyError, IndexError, ValueError) as exc:
        raise SpecError(
            "", f"--node-cache-dir {template!r}: only {{name}} and {{id}} may be used ({exc})"
        ) from None
    if not (template.startswith("/") or template.startswith("~")):
        raise SpecError("", f"--node-cache-dir {template!r}: must be an absolute path")
