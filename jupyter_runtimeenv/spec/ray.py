"""Ray's runtime_env fields this project does not build, and how a spec names them.

Who reads it: ``spec.parse``. A Ray user pastes the ``runtime_env`` they already use; a field
that only makes sense inside a Ray cluster is refused with one line saying so (not "unknown
field"), and Ray's own bookkeeping fields (which Ray adds to specs it serialises) are dropped.
A plugin registered for one of these names claims it as usual.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import SpecError

__all__ = ["RAY_INTERNAL", "RAY_ONLY", "check_ray_form", "ray_only_reason"]

#: Field -> what it is in Ray.
RAY_ONLY: dict[str, str] = {
    "container": "running workers in a container image",
    "image_uri": "running workers in a container image",
    "java_jars": "jars for Java workers",
    "_nsight": "Nsight Systems profiling of workers",
    "nsight": "Nsight Systems profiling of workers",
    "_rocprof_sys": "rocprof-sys profiling of workers",
    "rocprof_sys": "rocprof-sys profiling of workers",
    "_unitrace": "unitrace profiling of workers",
    "mpi": "MPI worker groups",
    "secret_env_vars": "environment variables kept base64-encoded in the spec",
}

#: Ray adds these to the specs it serialises; they carry no request.
RAY_INTERNAL = ("_ray_release", "_ray_commit", "_inject_current_ray")


def ray_only_reason(field: str) -> str | None:
    """The one-line refusal for a Ray-only field, or None if ``field`` is not one."""
    what = RAY_ONLY.get(field)
    if what is None:
        return None
    return f"a Ray feature ({what}) that jupyter-runtimeenv does not provide; remove the field"


#: Ray's keys of one of its two package fields, refused in the other (as Ray does). Our own
#: keys (``packages``, ``install_options``, ``pip_check``, and ``uv_version`` that our normal
#: form keeps) are taken by both.
_NOT_IN = {
    "pip": ("uv_check", "uv_pip_install_options"),
    "uv": ("pip_version", "pip_install_options"),
}


def check_ray_form(field: str, value: Any) -> None:
    """Refuse, naming the field, a value Ray refuses at parse time where the field's plugin
    alone would take it (rules that depend on how the field was named, or that Ray applies
    before anything is built). Called by ``parse`` before the plugin's ``validate``."""
    if field in _NOT_IN and isinstance(value, Mapping):
        for key in value:
            if key in _NOT_IN[field]:
                other = "uv" if field == "pip" else "pip"
                raise SpecError(
                    f"{field}.{key}",
                    f"a key of Ray's {other!r} field; Ray refuses it in {field!r} (give the"
                    f" packages as {other!r}, or use {field!r}'s own keys)",
                )
        # A mapping without 'packages' is refused by the plugin (after its type checks, in
        # Ray's order).
        if field == "uv" and isinstance(value.get("packages"), str):
            raise SpecError(
                "uv.packages",
                "expected a list of requirements (as in Ray; a requirements file is given as"
                " the whole field: uv: requirements.txt)",
            )
    elif field == "py_executable" and isinstance(value, str):
        words = value.split()
        if len(words) == 2 and os.path.basename(words[0]) in ("uv", "uv.exe") and words[1] == "run":
            raise SpecError(
                "py_executable",
                "a bare 'uv run' names no interpreter (Ray refuses it too since 2.47): give"
                " the whole command, e.g. 'uv run --python 3.11 python', or leave the field out",
            )
    elif field == "conda" and isinstance(value, str) and _missing_prefix(value):
        raise SpecError("conda", f"{value}: no conda environment directory there (as in Ray)")


def _missing_prefix(value: str) -> bool:
    """An absolute path given as an env's prefix where there is no directory."""
    path = os.path.expanduser(value)
    if not os.path.isabs(path) or value.endswith((".yml", ".yaml")) or "://" in value:
        return False
    return not os.path.isdir(path)


def gcs_uri_reason(uri: str) -> str | None:
    """The refusal for Ray's ``gcs://`` package URIs (uploaded to a Ray cluster's store)."""
    if uri.startswith("gcs://"):
        return (
            f"{uri}: gcs:// URIs name packages uploaded to a Ray cluster's GCS, a Ray feature"
            " jupyter-runtimeenv does not provide; give the local path or a gs:// / s3:// URI"
        )
    return None
