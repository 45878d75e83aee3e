"""Worker stdout/stderr, forwarded line by line to where the submitting code prints.

``OutputTarget.capture()`` is called by ``RemoteFunction.remote`` at submission: it keeps
``sys.stdout``/``sys.stderr`` *and* a copy of the current ``contextvars`` context. ipykernel
(7+) keeps the parent header of the executing cell in a context variable, so writing
inside the captured context sends the line to the cell that submitted the task even when a
later cell is running. ``StreamForwarder`` is fed raw bytes by the worker's reader thread
(``process.py``) and emits complete lines prefixed like Ray: ``(crunch pid=1234) line``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from dataclasses import dataclass
from typing import TextIO


@dataclass
class OutputTarget:
    """Where one task's output goes: the submitter's streams, written in its context."""

    name: str
    stdout: TextIO
    stderr: TextIO
    context: contextvars.Context

    @classmethod
    def capture(cls, name: str) -> OutputTarget:
        return cls(name, sys.stdout, sys.stderr, contextvars.copy_context())

    def write(self, stream: int, text: str) -> None:
        """Write ``text`` to stdout (``stream == 1``) or stderr (2) in the captured context.

        Only the owning worker's reader thread calls this for a given target, so the
        context is never entered by two threads at once.
        """
        target = self.stdout if stream == 1 else self.stderr
        # ValueError/OSError: the stream was closed (a kernel restart, the end of a test).
        with contextlib.suppress(ValueError, OSError):
            self.context.run(_write, target, text)


def _write(target: TextIO, text: str) -> None:
    target.write(text)
    target.flush()


class StreamForwarder:
    """Splits one worker stream into lines and sends them to the current target."""

    def __init__(self, stream: int, pid: int) -> None:
        self.stream = stream
        self.pid = pid
        self._partial = b""

    def feed(self, data: bytes, target: OutputTarget | None) -> None:
        """Emit every complete line of ``_partial + data``; keep the rest for later."""
        data = self._partial + data
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return
        self._partial = data[end + 1 :]
        self._emit(data[: end + 1].decode("utf-8", "replace").splitlines(), target)

    def flush(self, target: OutputTarget | None) -> None:
        """Emit a pending partial line (the task ended, or the worker did)."""
        if self._partial:
            text, self._partial = self._partial.decode("utf-8", "replace"), b""
            self._emit([text], target)

    def _emit(self, lines: list[str], target: OutputTarget | None) -> None:
        name = target.name if target is not None else "worker"
        prefix = f"({name} pid={self.pid}) "
        text = "".join(f"{prefix}{line}\n" for line in lines)
        if target is not None:
            target.write(self.stream, text)
        else:
            fallback = sys.stdout if self.stream == 1 else sys.stderr
            try:
                fallback.write(text)
                fallback.flush()
            except (ValueError, OSError):
                pass
