"""The one exception tree of jupyter-runtimeenv.

    RuntimeEnvError
    ├── SpecError(ValueError)        a bad spec; ``.field`` is the path, e.g. ``env_vars.A``
    ├── PluginNotFound(SpecError)    a plugin named in a spec or entry point cannot be loaded
    ├── BuildError                   building an environment failed (env id, step, log, output tail)
    │   └── BuildTimeout             ... because the build's deadline passed
    ├── EnvNotFound(KeyError)        no environment with that id
    ├── EnvInUse                     removing an environment that others still hold
    ├── InvalidName(ValueError)      a holder or other name outside its alphabet
    ├── AgentUnavailable             the agent (server or embedded) cannot be reached
    ├── CacheUnavailable             the cache cannot be opened or written (full, read-only, ...)
    ├── WorkerError                  a worker process failed to start or to talk
    │   ├── BrokenWorker             a worker died or broke the protocol mid-task
    │   └── WorkerSetupError         the spec's worker_process_setup_hook raised in a worker
    ├── KernelStartError             a kernel on a Dask node could not start (names the node)
    ├── SerializationError(TypeError) a task's function, argument or result cannot be pickled
    └── RemoteTaskError              the task raised; renders the remote traceback
        └── RemoteCellError          a %%remote cell raised; shown as the cell's own exception

    KeyboardInterrupt
    └── RemoteInterrupt              an interrupt that cancelled the remote tasks it waited on,
                                     or stopped a cell waiting for a build (which goes on)

Third-party errors are converted at the boundary where they enter this package.
"""

from __future__ import annotations

import builtins
import weakref
from collections.abc import Sequence
from typing import Any

from ._exc_state import blank, describe, fields, rebuild, restore, safe_str
from .redact import redact_text

__all__ = [
    "AgentUnavailable",
    "BrokenWorker",
    "BuildError",
    "BuildTimeout",
    "CacheUnavailable",
    "EnvInUse",
    "EnvNotFound",
    "InvalidName",
    "KernelStartError",
    "PluginNotFound",
    "RemoteCellError",
    "RemoteInterrupt",
    "RemoteTaskError",
    "RuntimeEnvError",
    "SerializationError",
    "SpecError",
    "WorkerError",
    "WorkerSetupError",
]


class RuntimeEnvError(Exception):
    """Base class of every error raised by jupyter-runtimeenv."""


class SpecError(RuntimeEnvError, ValueError):
    """A runtime env spec was refused before any work was done.

    ``field`` is the dotted path of the offending value (``""`` for the whole spec);
    ``reason`` says what was expected.
    """

    def __init__(self, field: str, reason: str) -> None:
        # URLs without their user info, query or fragment, in every error (``redact``).
        reason = redact_text(reason)
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)

    def within(self, prefix: str) -> SpecError:
        """The same error, its field path nested under ``prefix``."""
        field = f"{prefix}.{self.field}" if self.field else prefix
        error = type(self).__new__(type(self))
        SpecError.__init__(error, field, self.reason)
        return error

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_spec_error, (type(self), self.field, self.reason))


def _rebuild_spec_error(cls: type[SpecError], field: str, reason: str) -> SpecError:
    error = cls.__new__(cls)
    SpecError.__init__(error, field, reason)
    return error


class PluginNotFound(SpecError):
    """A plugin could not be loaded; ``field`` names where it was asked for."""


class BuildError(RuntimeEnvError):
    """Building an environment failed.

    Carries the env id, the step that failed (a plugin name and URI) and its label as users
    read it (``pip: numpy==9.9``), the tail of that step's output and the path of the full log.
    """

    def __init__(
        self,
        message: str,
        *,
        env_id: str = "",
        step: str = "",
        output_tail: Sequence[str] = (),
        log_path: str = "",
        label: str = "",
    ) -> None:
        self.message = redact_text(message)
        self.env_id = env_id
        self.step = step
        self.label = redact_text(label)
        self.output_tail = [redact_text(line) for line in output_tail]
        self.log_path = log_path
        super().__init__(message)

    @property
    def where(self) -> str:
        """The failed step as users read it: its label, else the step."""
        return self.label or self.step

    @property
    def log_reference(self) -> str:
        """How a reader gets the whole log, in text: the command that prints it (``jupyter
        runtimeenv logs <id>``), the path only when the env id is unknown. Not the path: in a
        notebook's output JupyterLab turns a path into a link that asks to start the
        debugger; the notebook's own link to the log is "View log" (``log_path`` keeps the
        path for programs)."""
        if self.env_id:
            return f"jupyter runtimeenv logs {self.env_id[:12]}"
        return self.log_path

    def __str__(self) -> str:
        lines = [self.message]
        if self.where:
            lines[0] = f"{self.where}: {self.message}"
        if self.output_tail:
            lines.append("--- last lines of output ---")
            lines.extend(self.output_tail)
        if self.log_path:
            lines.append(f"(full log: {self.log_reference})")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "message": self.message,
            "env_id": self.env_id,
            "step": self.step,
            "label": self.label,
            "output_tail": self.output_tail,
            "log_path": self.log_path,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildError:
        kind = BuildTimeout if data.get("type") == "BuildTimeout" else BuildError
        return kind(
            str(data.get("message", "build failed")),
            env_id=str(data.get("env_id", "")),
            step=str(data.get("step", "")),
            output_tail=list(data.get("output_tail", [])),
            log_path=str(data.get("log_path", "")),
            label=str(data.get("label", "")),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_build_error, (self.to_json(),))


def _rebuild_build_error(data: dict[str, Any]) -> BuildError:
    return BuildError.from_json(data)


class BuildTimeout(BuildError):
    """The build passed its deadline; every step was cancelled and its processes killed."""


class EnvNotFound(RuntimeEnvError, KeyError):
    """No environment with this id is known to the agent."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "environment not found"


class EnvInUse(RuntimeEnvError):
    """An environment cannot be removed while other holders reference it."""


class InvalidName(RuntimeEnvError, ValueError):
    """A holder name (or another name the agent keys things by) is outside its alphabet."""


class AgentUnavailable(RuntimeEnvError):
    """The agent could not be reached."""


class CacheUnavailable(RuntimeEnvError):
    """The cache cannot be used: its root cannot be created, is not private, or the disk
    under it is full or read-only. ``path`` is the cache root, ``cause`` why, in words."""

    def __init__(self, path: str, cause: str) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"cannot use the cache at {path}: {cause}")

    def __str__(self) -> str:
        return f"cannot use the cache at {self.path}: {self.cause}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (CacheUnavailable, (self.path, self.cause))


class WorkerError(RuntimeEnvError):
    """A worker process could not be started or could not be talked to."""


class BrokenWorker(WorkerError):
    """A worker died or broke the protocol while running a task."""


class WorkerSetupError(WorkerError):
    """The spec's ``worker_process_setup_hook`` failed in a starting worker.

    ``hook`` names it, ``traceback`` is the worker's; no task ran in that worker.
    """

    def __init__(self, message: str, *, hook: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.hook = hook
        self.traceback = traceback


class KernelStartError(RuntimeEnvError):
    """A kernel on a Dask node could not be started: the scheduler cannot be reached, it has
    no workers, the env failed to build on the node, or the kernel did not come up in time.

    ``str()`` is one line naming the node (``node`` is ``""`` before one was picked);
    ``detail`` holds more lines (an installer's output tail, the kernel's last output).
    """

    def __init__(self, message: str, *, node: str = "", detail: Sequence[str] = ()) -> None:
        self.message = message
        self.node = node
        self.detail = list(detail)
        super().__init__(message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_kernel_start_error, (self.message, self.node, self.detail))


def _rebuild_kernel_start_error(message: str, node: str, detail: list[str]) -> KernelStartError:
    return KernelStartError(message, node=node, detail=detail)


class SerializationError(RuntimeEnvError, TypeError):
    """A task's function, an argument or its result could not be pickled.

    The message names which one (``argument 1``, ``keyword argument 'x'``, ``the result``).
    """


class RemoteTaskError(RuntimeEnvError):
    """A task raised in its worker.

    ``cause`` is the original exception rebuilt in the driver (so ``isinstance(err.cause,
    KeyError)`` works); ``remote_traceback`` is the text the worker formatted;
    ``remote_type`` the qualified name of the remote exception's class (which the driver
    may lack: ``cause`` is then an instance of its nearest base the driver has).
    Catching the original type works too: ``wrap`` returns an instance of a class derived
    from both this class and the cause's, carrying the cause's ``args`` and attributes
    (``errno``, ``returncode``, ``pos``...), made without calling the cause class's
    ``__init__`` or ``__new__`` (which may take other arguments than ``args``).
    """

    #: The name of the class derived from this one and the cause's (``wrap``).
    _dual_name = "RemoteTaskError[{}]"
    #: The causes ``wrap`` derives a class from: a task's ``SystemExit`` or
    #: ``KeyboardInterrupt`` must not pass for the caller's own (``except Exception``
    #: keeps catching it).
    _dual_base: type[BaseException] = Exception

    def __init__(
        self,
        function: str,
        remote_traceback: str,
        cause: BaseException | None = None,
        remote_type: str = "",
    ) -> None:
        self.function = function
        self.remote_traceback = remote_traceback
        self.cause = cause
        self.remote_type = remote_type or _qualified(cause)
        super().__init__(function, remote_traceback, cause)

    def __str__(self) -> str:
        head = f"{self.function} raised in its worker"
        if self.cause is not None:
            name = self.remote_type.rpartition(".")[2] or type(self.cause).__name__
            head += f": {name}: {safe_str(self.cause)}"
        return f"{head}\n\nRemote traceback:\n{self.remote_traceback.rstrip()}"

    @classmethod
    def wrap(
        cls,
        function: str,
        remote_traceback: str,
        cause: BaseException | None,
        remote_type: str = "",
    ) -> RemoteTaskError:
        """An error that is both a ``RemoteTaskError`` and, if possible, the cause's type."""
        if isinstance(cause, cls._dual_base) and not isinstance(cause, RemoteTaskError):
            dual = _dual_class(cls, type(cause))
            if dual is not None:
                try:
                    error = blank(dual, cause.args, _group_args(cause))
                except TypeError:  # a C type whose __new__ wants arguments we lack
                    pass
                else:
                    restore(error, fields(cause))
                    error.__dict__.update(
                        function=function,
                        remote_traceback=remote_traceback,
                        cause=cause,
                        remote_type=remote_type or _qualified(cause),
                    )
                    return error  # type: ignore[return-value]
        return cls(function, remote_traceback, cause, remote_type)

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of the local frames: the remote traceback."""
        lines = self.remote_traceback.rstrip().splitlines()
        return [*lines, f"(raised in the worker of {self.function})"]

    def __reduce__(self) -> tuple[Any, ...]:
        # The cause goes as its pieces: its class may not take ``args`` back (see _exc_state).
        # cloudpickle is imported here, not at the top: every command of the CLI and every
        # module of the agent imports this tree, and only a worker's error needs it.
        import cloudpickle

        cause = None if self.cause is None else describe(self.cause, cloudpickle.dumps)
        kind = RemoteCellError if isinstance(self, RemoteCellError) else RemoteTaskError
        return (
            _rebuild_remote_error,
            (self.function, self.remote_traceback, cause, self.remote_type, kind),
        )


class RemoteCellError(RemoteTaskError):
    """A ``%%remote`` cell raised: shown as the cell run in the kernel would show it. The
    class ``wrap`` makes bears the cause's own name and ``str()`` is the cause's message, so
    a notebook shows ``ValueError: operands could not be broadcast ...`` as for a local cell
    (ipykernel's ``ename``/``evalue``), above the remote traceback."""

    _dual_name = "{}"
    #: A cell's ``sys.exit(2)`` or ``raise KeyboardInterrupt`` too: IPython shows them as
    #: it shows a local cell's (``SystemExit: 2`` and its "To exit" warning).
    _dual_base = BaseException

    def __str__(self) -> str:
        if self.cause is None:
            return super().__str__()
        return safe_str(self.cause)


def _rebuild_remote_error(
    function: str,
    remote_traceback: str,
    cause: dict[str, Any] | None,
    remote_type: str,
    kind: type[RemoteTaskError] | None = None,
) -> RemoteTaskError:
    import cloudpickle

    return (kind or RemoteTaskError).wrap(
        function, remote_traceback, rebuild(cause, cloudpickle.loads)[0], remote_type
    )


def _qualified(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    kind = type(exc)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _group_args(exc: BaseException) -> tuple[str, list[BaseException]] | None:
    group = getattr(builtins, "BaseExceptionGroup", None)
    if group is not None and isinstance(exc, group):
        return exc.message, list(exc.exceptions)
    return None


#: (RemoteTaskError subclass, cause class) -> their dual class, or None when Python
#: refuses the combination. Weak on the cause class: a notebook redefines its classes.
_duals: weakref.WeakKeyDictionary[type, dict[type, type[RemoteTaskError] | None]] = (
    weakref.WeakKeyDictionary()
)


def _dual_class(
    cls: type[RemoteTaskError], cause: type[BaseException]
) -> type[RemoteTaskError] | None:
    per_cause = _duals.setdefault(cause, {})
    if cls not in per_cause:
        try:
            per_cause[cls] = type(
                cls._dual_name.format(cause.__name__),
                (cls, cause),
                {
                    "__module__": cls.__module__,
                    "__qualname__": cls._dual_name.format(cause.__qualname__),
                },
            )
        except TypeError:  # incompatible layouts, or a final class (bool-like)
            per_cause[cls] = None
    return per_cause[cls]


class RemoteInterrupt(KeyboardInterrupt):
    """An interrupt (Ctrl-C, the notebook's stop button) while ``get``, ``wait``, ``result``
    or ``%%remote`` waited: it cancelled ``cancelled`` (their workers were killed); or while
    ``%runtime_env`` waited for a build, which goes on (``cancelled`` is empty).

    A ``KeyboardInterrupt``, so code that catches interrupts still does; not a
    ``RuntimeEnvError``, so ``except Exception`` does not swallow it. IPython shows its one
    line (``KeyboardInterrupt: cancelled 3 remote tasks of crunch``) instead of the frames
    of the wait it broke.
    """

    def __init__(self, message: str, cancelled: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.cancelled = list(cancelled)

    def __str__(self) -> str:
        return self.message

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self.message}" if self.message else "KeyboardInterrupt"]

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteInterrupt, (self.message,))
