"""Worker stdout/stderr, forwarded line by line to where the submitting code prints.

``OutputTarget.capture()`` is called by ``RemoteFunction.remote`` at submission: it keeps
``sys.stdout``/``sys.stderr`` *and* a copy of the current ``contextvars`` context. ipykernel
(7+) keeps the parent header of the executing cell in a context variable, so writing
inside the captured context sends the line to the cell that submitted the task even when a
later cell is running. ``StreamForwarder`` is fed raw bytes by the worker's reader thread
(``process.py``) and emits complete lines prefixed like Ray: ``(crunch pid=1234) line``;
a line longer than ``LINE_CAP`` is written in pieces as it comes (see ``StreamForwarder``).
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import sys
from dataclasses import dataclass
from typing import TextIO

#: A partial line is written once this many characters of it are pending.
LINE_CAP = 64 * 1024


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
        # Closed (ValueError/OSError: a kernel restart, the end of a test) or broken (any
        # replacement of sys.stdout): output is best effort, the task's result is not.
        with contextlib.suppress(Exception):
            self.context.run(_write, target, text)


def _write(target: TextIO, text: str) -> None:
    target.write(text)
    target.flush()


class StreamForwarder:
    """Splits one worker stream into lines and sends them to the current target.

    Each line is written as ``(name pid=N) text\n``. A line longer than ``cap`` characters
    is not held back until its end: once its pending part passes ``cap`` it is written in
    pieces, the first with the prefix and the next ones without, and the line's end adds the
    newline, so what arrives is still exactly one prefix, the whole line and a newline. Work
    is linear in the output's size: pending text is kept as a list of pieces and each byte
    is searched for a newline once. Bytes are decoded incrementally (a UTF-8 character split
    across reads is decoded whole); invalid bytes become U+FFFD.
    """

    def __init__(self, stream: int, pid: int, cap: int = LINE_CAP) -> None:
        self.stream = stream
        self.pid = pid
        self.cap = cap
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending: list[str] = []
        self._pending_size = 0
        self._open = False  # part of the current line was written already (with its prefix)

    def feed(self, data: bytes, target: OutputTarget | None) -> None:
        """Write every complete line of what was fed so far; keep the rest (up to ``cap``)."""
        text = self._decoder.decode(data)
        if not text:
            return
        end = text.rfind("\n")
        if end < 0:
            self._pending.append(text)
            self._pending_size += len(text)
            if self._pending_size >= self.cap:
                self._write_pending(target)
            return
        self._pending.append(text[: end + 1])
        lines = "".join(self._pending)
        rest = text[end + 1 :]
        self._pending = [rest] if rest else []
        self._pending_size = len(rest)
        prefix = self._prefix(target)
        if self._open:  # the first line continues what was written without a newline
            head, _, lines = lines.partition("\n")
            self._open = False
            out = head + "\n"
        else:
            out = ""
        if lines:
            out += prefix + lines[:-1].replace("\n", "\n" + prefix) + "\n"
        self._write(out, target)
        if self._pending_size >= self.cap:
            self._write_pending(target)

    def flush(self, target: OutputTarget | None) -> None:
        """End a pending or partly written line with a newline (the task or worker ended)."""
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._pending.append(tail)
        if self._pending:
            text = "".join(self._pending)
            self._pending, self._pending_size = [], 0
            self._write(("" if self._open else self._prefix(target)) + text + "\n", target)
        elif self._open:
            self._write("\n", target)
        self._open = False

    def _write_pending(self, target: OutputTarget | None) -> None:
        text = "".join(self._pending)
        self._pending, self._pending_size = [], 0
        self._write(text if self._open else self._prefix(target) + text, target)
        self._open = True

    def _prefix(self, target: OutputTarget | None) -> str:
        name = target.name if target is not None else "worker"
        return f"({name} pid={self.pid}) "

    def _write(self, text: str, target: OutputTarget | None) -> None:
        if target is not None:
            target.write(self.stream, text)
        else:
            fallback = sys.stdout if self.stream == 1 else sys.stderr
            try:
                fallback.write(text)
                fallback.flush()
            except Exception:  # best effort, as in ``OutputTarget.write``
                pass
