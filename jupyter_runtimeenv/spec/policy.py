"""``SpecPolicy``: what the sender of a spec may make the agent do.

Two kinds of sender exist (docs/security.md):

- **the user's own process** (the embedded agent of a notebook or a script, the CLI, the kernel
  provisioner reading a kernelspec from disk) is trusted (``TRUSTED``): it may name plugins by
  any import path and any executable, because it already runs the user's code;
- **a request to the Jupyter server's agent** (over REST, from a browser or from a kernel that
  uses the server's agent) is trusted to build, not to execute (``SpecPolicy.untrusted``): its
  ``plugins`` may only name plugins registered through the entry point group or listed by the
  operator, ``driver_python`` and ``py_executable`` must be Python interpreters, and nothing is
  imported or run before the whole spec is validated.

The agent carries its policy (``RuntimeEnvAgent(policy=...)``); ``parse(data, policy=...)``
applies it while the spec is validated. Plugins that must consult it (those naming executables)
call ``current_policy()``, a context variable set for the duration of ``parse``, as the base
directory of relative paths is.
"""

from __future__ import annotations

import contextvars
import os
import re
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import PluginNotFound, SpecError
from .files import BadFile, read_head

__all__ = [
    "TRUSTED",
    "SpecPolicy",
    "applying",
    "current_policy",
    "interpreter_problem",
    "is_import_path",
]

#: ``package.module.Class`` or ``package.module:Class``: identifiers only, nothing else.
_IMPORT_PATH = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*[.:][A-Za-z_][A-Za-z0-9_]*"
)
#: The file names Python interpreters have: python, python3, python3.12, python3.13t, pypy3.10,
#: python.exe (Windows).
_INTERPRETER_NAME = re.compile(r"(?:python|pypy)(?:[0-9]+(?:\.[0-9]+)*)?t?(?:\.exe)?")
#: Native executables: ELF, Mach-O (both byte orders, 32/64-bit, universal), PE.
_BINARY_MAGIC = (
    b"\x7fELF",
    b"\xfe\xed\xfa\xce",
    b"\xfe\xed\xfa\xcf",
    b"\xce\xfa\xed\xfe",
    b"\xcf\xfa\xed\xfe",
    b"\xca\xfe\xba\xbe",
    b"MZ",
)
#: Nesting deeper than this is refused: no spec needs it, and deeper data can exhaust the
#: recursion of the JSON encoder and of plugins.
DEFAULT_MAX_DEPTH = 32


#: Longer names are refused before any regular expression sees them (a 1 MB "a.a.a..." held
#: the GIL for a quarter of a second in one ``fullmatch``).
MAX_IMPORT_PATH = 512


def is_import_path(path: str) -> bool:
    """Whether ``path`` looks like ``package.module.Class`` (or ``package.module:Class``)."""
    return len(path) <= MAX_IMPORT_PATH and _IMPORT_PATH.fullmatch(path) is not None


@dataclass(frozen=True)
class SpecPolicy:
    """What a spec's sender is trusted with. ``TRUSTED`` is the default everywhere but in the
    Jupyter server's agent."""

    #: Any import path may be named in ``plugins`` (else: entry points and ``allowed_plugins``).
    import_plugins: bool = True
    #: Import paths an untrusted sender may name besides the registered plugins.
    allowed_plugins: frozenset[str] = field(default_factory=frozenset)
    #: ``driver_python``/``py_executable`` may be any executable (else: Python interpreters).
    any_executable: bool = True
    #: How deep values may nest.
    max_depth: int = DEFAULT_MAX_DEPTH
    #: Requirements, constraints and environment files must be inside this directory (the
    #: server's root); None: anywhere.
    files_root: str | None = None
    #: Errors may quote what a file holds (a line that is not a requirement, a YAML error's
    #: excerpt). Not over REST: the answer would hand a file's content to the sender.
    quote_files: bool = True

    @classmethod
    def untrusted(
        cls, allowed_plugins: Iterable[str] = (), *, files_root: str | None = None
    ) -> SpecPolicy:
        """The policy of requests to the server's agent: ``allowed_plugins`` are the import
        paths the operator lists (``RuntimeEnvExtension.allowed_plugins``), ``files_root``
        the server's root directory (requirements and environment files are read only
        below it)."""
        return cls(
            import_plugins=False,
            allowed_plugins=frozenset(allowed_plugins),
            any_executable=False,
            files_root=os.path.realpath(files_root) if files_root else None,
            quote_files=False,
        )

    @property
    def trusted(self) -> bool:
        return self.import_plugins and self.any_executable

    def check_plugin(self, path: str, *, registered: bool) -> None:
        """Refuse ``plugins.<path>`` unless this sender may name it; called before any import.
        ``registered``: ``path`` is the import path of a plugin from the entry point group."""
        field_path = f"plugins.{path if len(path) <= 200 else path[:200] + '...'}"
        if not is_import_path(path):
            raise PluginNotFound(
                field_path, f"{path[:200]!r} is not an import path like 'package.module.Class'"
            )
        if self.import_plugins or registered or path in self.allowed_plugins:
            return
        allowed = ", ".join(sorted(self.allowed_plugins)) or "none"
        raise PluginNotFound(
            field_path,
            f"plugin {path!r} is not allowed here: only plugins registered through the entry"
            " point group 'jupyter_runtimeenv.plugins' and those the server's operator lists in"
            f" RuntimeEnvExtension.allowed_plugins may be named (allowed: {allowed})",
        )

    def check_file(self, path: str, what: str) -> None:
        """Refuse reading ``path`` (absolute) as a ``what`` (``requirements file``) unless it
        resolves below ``files_root``; ``SpecError`` with an empty field (the caller nests)."""
        if self.files_root is None:
            return
        real = os.path.realpath(path)
        if real != self.files_root and not real.startswith(self.files_root.rstrip(os.sep) + os.sep):
            raise SpecError(
                "",
                f"{path}: a {what} outside the server's root directory is not read for"
                " requests to the server (the CLI, or an agent in your own process, reads it)",
            )

    def check_executable(self, path: str) -> None:
        """Refuse ``path`` (absolute, found) as an interpreter unless this sender may run it;
        ``SpecError`` with an empty field (the caller's plugin names its field)."""
        if self.any_executable:
            return
        problem = interpreter_problem(path)
        if problem is not None:
            raise SpecError("", f"{path!r} is not accepted as a Python interpreter here: {problem}")


TRUSTED = SpecPolicy()

_current: contextvars.ContextVar[SpecPolicy] = contextvars.ContextVar(
    "spec_policy", default=TRUSTED
)


def current_policy() -> SpecPolicy:
    """The policy of the spec being parsed (``TRUSTED`` outside ``parse``)."""
    return _current.get()


@contextmanager
def applying(policy: SpecPolicy) -> Iterator[None]:
    token = _current.set(policy)
    try:
        yield
    finally:
        _current.reset(token)


def interpreter_problem(path: str) -> str | None:
    """Why ``path`` is not a Python interpreter, judged without running it; None if it is one.

    The file (symlinks resolved) must be a regular executable file, both the name given and
    the resolved name must be interpreter names (``python``, ``python3.12``, ``pypy3``...), it
    must be a native binary (ELF, Mach-O or PE: no scripts, whose ``#!`` line could start any
    program), and it must sit in a Python installation: ``../lib/pythonX.Y/os.py`` (or
    ``Lib/os.py``) next to the binary, or a venv's ``pyvenv.cfg`` next to the path given.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except (OSError, ValueError) as exc:
        return f"cannot read it ({exc})"
    if not stat.S_ISREG(st.st_mode) or not os.access(real, os.X_OK):
        return "not an executable file"
    for name in {os.path.basename(path), os.path.basename(real)}:
        if _INTERPRETER_NAME.fullmatch(name) is None:
            return f"{name!r} is not the name of a Python interpreter (python, python3.X, pypy3)"
    try:
        head = read_head(real, 4)
    except BadFile as exc:
        return str(exc)
    if not head.startswith(_BINARY_MAGIC):
        return "not a native executable (scripts are refused: their #! line could run anything)"
    if not (_has_stdlib(os.path.dirname(real)) or _in_venv(path)):
        return "no Python installation around it (no lib/pythonX.Y/os.py and no pyvenv.cfg)"
    return None


def _has_stdlib(bindir: str) -> bool:
    prefix = os.path.dirname(bindir)
    lib = os.path.join(prefix, "lib")
    try:
        names = os.listdir(lib)
    except OSError:
        names = []
    for name in names:
        if re.fullmatch(r"(?:python|pypy)[0-9]+\.[0-9]+t?", name) and os.path.isfile(
            os.path.join(lib, name, "os.py")
        ):
            return True
    return os.path.isfile(os.path.join(bindir, "Lib", "os.py"))  # Windows layout


def _in_venv(path: str) -> bool:
    bindir = os.path.dirname(os.path.abspath(path))
    return any(
        os.path.isfile(os.path.join(d, "pyvenv.cfg")) for d in (bindir, os.path.dirname(bindir))
    )
