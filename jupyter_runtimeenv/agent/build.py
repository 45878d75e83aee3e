"""The ``BuildContext`` a plugin's ``create`` receives, and the env log it writes to."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from ..errors import BuildError
from ..plugins.base import RunResult
from ..redact import redact_text
from ..spec import RuntimeEnvSpec
from .limits import Limiter
from .pgroups import LIVE

T = TypeVar("T")


class GroupRecords(Protocol):
    """Where process groups are recorded across processes (``Cache``)."""

    def record_group(self, pgid: int) -> float | None: ...

    def forget_group(self, pgid: int) -> None: ...


class EnvLog:
    """An env's build log: kept in memory, written to its file off the loop."""

    def __init__(self, path: Path, publish: Callable[[str, str], None]) -> None:
        self.path = path
        self.lines: list[str] = []
        self._pending: list[str] = []
        self._publish = publish

    def write(self, step: str, line: str) -> None:
        line = line.rstrip("\n")
        text = f"[{step}] {line}" if step else line
        self.lines.append(text)
        self._pending.append(text)
        self._publish(step, line)

    async def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        await asyncio.to_thread(_append, self.path, pending)

    def text(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")


def _append(path: Path, lines: list[str]) -> None:
    # Owner-only: installer output may show paths, index URLs with credentials, env values.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(fd, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


class ResourceBuild:
    """What one ``create(uri, value, build)`` call gets; see ``plugins.base.BuildContext``."""

    def __init__(
        self,
        *,
        env_id: str,
        spec: RuntimeEnvSpec,
        uri: str,
        step: str,
        target: Path,
        cache_root: Path,
        log: EnvLog,
        limiter: Limiter,
        resource_path: Callable[[str], Path],
        groups: GroupRecords | None = None,
    ) -> None:
        self.env_id = env_id
        self.spec = spec
        self.uri = uri
        self.step = step
        self.target = target
        self.cache_root = cache_root
        self._log = log
        self._limiter = limiter
        self._resource_path = resource_path
        self._groups = groups
        self.tail: deque[str] = deque(maxlen=30)
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def log(self, line: str) -> None:
        # A sync plugin's create runs in a thread: hand its lines to the loop's thread.
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self.log, line)
            return
        # URLs lose their user info and query here, before the log file, the events and an
        # error's output tail see them (an installer may print a presigned or token URL).
        for part in redact_text(line).splitlines() or [""]:
            self.tail.append(part)
            self._log.write(self.step, part)

    def limit(self, kind: Literal["install", "download"]) -> AbstractAsyncContextManager[None]:
        return self._limiter.limit(kind)

    async def to_thread(self, func: Callable[..., T], /, *args: Any) -> T:
        return await asyncio.to_thread(func, *args)

    def resource_path(self, uri: str) -> Path:
        return self._resource_path(uri)

    async def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        check: bool = True,
        what: str = "",
    ) -> RunResult:
        output: list[str] = []
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                # Own process group: on cancel we kill the installer and everything it
                # started (build backends, compilers), not just the first process.
                start_new_session=True,
                limit=2**20,
            )
        except OSError as exc:
            raise BuildError(
                f"cannot start {argv[0]!r}: {exc.strerror or exc}",
                env_id=self.env_id,
                step=self.step,
            ) from exc
        # Recorded at once in memory (signals, exit) and in the index (the next agent ends
        # it if this process is SIGKILLed); see ``pgroups``.
        LIVE.add(proc.pid)
        try:
            if self._groups is not None:
                started = await asyncio.to_thread(self._groups.record_group, proc.pid)
                LIVE.add(proc.pid, started)
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                output.append(line)  # a BuildError made from it redacts its tail
                self.log(line)  # redacted there, once
            returncode = await proc.wait()
        except BaseException:
            _kill_group(proc)
            with contextlib.suppress(Exception):
                await asyncio.shield(proc.wait())
            raise
        finally:
            # Whatever the command left in its group (a daemonised helper) ends with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            LIVE.remove(proc.pid)
            if self._groups is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(asyncio.to_thread(self._groups.forget_group, proc.pid))
        if check and returncode != 0:
            label = what or Path(argv[0]).name
            raise BuildError(
                f"{label} failed with exit code {returncode}",
                env_id=self.env_id,
                step=self.step,
                output_tail=output[-30:],
            )
        return RunResult(returncode, output)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
