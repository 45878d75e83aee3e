"""A wheelhouse of tiny packages, built on the fly, so that tests never reach an index.

How tests point the installers at it: ``offline_installers(monkeypatch, wheelhouse)`` sets
``UV_NO_INDEX``/``UV_FIND_LINKS`` and ``PIP_NO_INDEX``/``PIP_FIND_LINKS`` in the test
process; the agent's installer subprocesses inherit the environment (``plugins._uv`` only
adds the caches), so every install of every test resolves from this directory and nothing
else — a test that forgot would fail offline rather than quietly reach PyPI. A spec can
also say it itself with ``{"packages": [...], "install_options": ["--no-index",
"--find-links", dir]}``; one test does, to cover that path.

Packages (import name = project name, each module has ``__version__`` and a console
script ``<name>-cli`` printing it):

- ``alpha`` 1.0 and 2.0 (2.0 adds a class ``Model``);
- ``beta`` 1.0, requires ``alpha>=2``; ``gamma`` 1.0, requires ``alpha<2`` (so ``beta`` with
  ``gamma`` is a resolver conflict); ``delta`` 1.0, requires ``beta``;
- ``cloudpickle`` 0.5.0 and ``picklebreaker`` 1.0, requiring ``cloudpickle<1`` (a
  dependency that would break the workers);
- ``hang`` 1.0, an sdist only, whose in-tree build backend writes its pid to
  ``$HANG_PID_FILE`` and then sleeps forever (for the deadline test).
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

__all__ = ["PACKAGES", "build_wheel", "make_wheelhouse", "offline_installers"]

#: (name, version, requirements)
PACKAGES: list[tuple[str, str, list[str]]] = [
    ("alpha", "1.0", []),
    ("alpha", "2.0", []),
    ("beta", "1.0", ["alpha>=2"]),
    ("gamma", "1.0", ["alpha<2"]),
    ("delta", "1.0", ["beta"]),
    ("cloudpickle", "0.5.0", []),
    ("picklebreaker", "1.0", ["cloudpickle<1"]),
]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path, name: str, version: str, requires: list[str]) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` holding the package ``name``."""
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    module = f"__version__ = {version!r}\n\ndef main():\n    print(__version__)\n"
    if (name, version) == ("alpha", "2.0"):  # new in 2.0: its pickles do not load in 1.0
        module += "\n\nclass Model:\n    pass\n"
    files = {
        f"{name}/__init__.py": module.encode(),
        f"{dist_info}/entry_points.txt": f"[console_scripts]\n{name}-cli = {name}:main\n".encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [_record_line(path, data) for path, data in files.items()]
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


_HANG_BACKEND = textwrap.dedent(
    """
    import os, time
    path = os.environ.get("HANG_PID_FILE")
    if path:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(3600)
    """
)


def build_hanging_sdist(directory: Path) -> Path:
    """``hang-1.0.tar.gz``: building it never ends (its backend sleeps on import)."""
    files = {
        "hang-1.0/pyproject.toml": (
            '[project]\nname = "hang"\nversion = "1.0"\n'
            '[build-system]\nrequires = []\nbuild-backend = "hang_backend"\nbackend-path = ["."]\n'
        ),
        "hang-1.0/hang_backend.py": _HANG_BACKEND,
    }
    path = directory / "hang-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def make_wheelhouse(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, version, requires in PACKAGES:
        build_wheel(directory, name, version, requires)
    build_hanging_sdist(directory)
    return directory


def offline_installers(monkeypatch: pytest.MonkeyPatch, wheelhouse: Path) -> None:
    """Make uv and pip (in this process's children) install from ``wheelhouse`` only."""
    for var, value in {
        "UV_NO_INDEX": "1",
        "UV_FIND_LINKS": str(wheelhouse),
        "UV_OFFLINE": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
    }.items():
        monkeypatch.setenv(var, value)
