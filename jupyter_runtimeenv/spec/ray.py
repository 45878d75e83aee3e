"""Ray's runtime_env fields this project does not build, and how a spec names them.

Who reads it: ``spec.parse``. A Ray user pastes the ``runtime_env`` they already use; a field
that only makes sense inside a Ray cluster is refused with one line saying so (not "unknown
field"), and Ray's own bookkeeping fields (which Ray adds to specs it serialises) are dropped.
A plugin registered for one of these names claims it as usual.
"""

from __future__ import annotations

__all__ = ["RAY_INTERNAL", "RAY_ONLY", "ray_only_reason"]

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
}

#: Ray adds these to the specs it serialises; they carry no request.
RAY_INTERNAL = ("_ray_release", "_ray_commit", "_inject_current_ray")


def ray_only_reason(field: str) -> str | None:
    """The one-line refusal for a Ray-only field, or None if ``field`` is not one."""
    what = RAY_ONLY.get(field)
    if what is None:
        return None
    return f"a Ray feature ({what}) that jupyter-runtimeenv does not provide; remove the field"


def gcs_uri_reason(uri: str) -> str | None:
    """The refusal for Ray's ``gcs://`` package URIs (uploaded to a Ray cluster's store)."""
    if uri.startswith("gcs://"):
        return (
            f"{uri}: gcs:// URIs name packages uploaded to a Ray cluster's GCS, a Ray feature"
            " jupyter-runtimeenv does not provide; give the local path or a gs:// / s3:// URI"
        )
    return None
