"""Worker stdout/stderr, forwarded line by line to where the submitting code prints.

``OutputTarget.capture()`` is called by ``RemoteFunction.remote`` at submission: it keeps
``sys.stdout``/``sys.stderr`` *and* a copy of the current ``contextvars`` context. ipykernel
(7+) keeps the parent header of the executing cell in a context variable, so writing
inside the captured context sends the line to the cell that submitted the task even when a
later cell is running. ``StreamForwarder`` is fed raw bytes by the worker's reader thread
(``process.py``) and emits complete lines prefixed like Ray: ``(crunch pid=1234) line``;
a line longer than ``LINE_CAP``, or partial for ``PARTIAL_DELAY`` seconds, is written in
pieces as it comes, and ``\r`` rewrites a line as in a terminal (see ``StreamForwarder``).
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import sys
import time
from dataclasses import dataclass
from typing import TextIO

#: A partial line is written once this many characters of it are pending.
LINE_CAP = 64 * 1024
#: ... or once it has waited this long (seconds): a progress bar shows while it runs.
PARTIAL_DELAY = 0.1


@dataclass
class OutputTarget:
    """Where one task's output goes: the submitter's streams, written in its context."""

    name: str
    stdout: TextIO
    stderr: TextIO
    context: contextvars.Context
    #: The task's last line is left open when the task ends (not ended with a newline):
    #: its output is shown apart from any other task's, as a cell's own output is.
    open_end: bool = False

    @classmethod
    def capture(cls, name: str) -> OutputTarget:
        """The current streams and context; ``open_end`` if ``sys.stdout`` says it shows one
        task's output alone (``keeps_last_line_open``: a ``%%remote`` cell's stream)."""
        open_end = getattr(sys.stdout, "keeps_last_line_open", False) is True
        return cls(name, sys.stdout, sys.stderr, contextvars.copy_context(), open_end)

    def write(self, stream: int, text: str) -> None:
        """Write ``text`` to stdout (``stream == 1``) or stderr (2) in the captured context.

        Only the thread reading the owning worker (its reader thread, or one waiting for
        an answer, under the worker's read lock: ``process.py``) calls this for a given
        target, so the context is never entered by two threads at once.
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

    Each line is written as ``(name pid=N) text\n``. A line is not held back until its end:

    - once its pending part passes ``cap`` characters it is written (a huge line costs time
      linear in its size);
    - a partial line pending for ``delay`` seconds is written too, so a progress bar (tqdm,
      pip) that rewrites its line with ``\r`` shows while it runs. The reader thread asks
      ``due()`` when that is and calls ``tick()`` (``process.py``).

    The first piece of a line carries the prefix, the next ones continue it, and the line's
    end adds the newline. ``\r`` is rendered as a terminal shows a line, its last state:
    of ``"a\rb"`` only ``b`` is written, a rewrite of a line already partly written is sent
    as ``\r`` + prefix + its new state (frontends replace the line, the prefix stays), and
    ``\r\n`` is a newline. A bar that rewrites its line a thousand times a second costs at
    most one write per ``delay``. Work is linear in the output's size: pending text is kept
    as a list of pieces and each byte is searched for a newline once. Bytes are decoded
    incrementally (a UTF-8 character split across reads is decoded whole); invalid bytes
    become U+FFFD.
    """

    def __init__(
        self, stream: int, pid: int, cap: int = LINE_CAP, delay: float = PARTIAL_DELAY
    ) -> None:
        self.stream = stream
        self.pid = pid
        self.cap = cap
        self.delay = delay
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending: list[str] = []
        self._pending_size = 0
        self._since = 0.0  # when the pending partial line began waiting
        self._open = False  # part of the current line was written already (with its prefix)
        self._rewind = False  # the line's next text replaces it (it ended with a lone \r)
        #: Fed since the last ``flush`` (else a flush, after every answer, has nothing to do).
        self._fed = False

    def feed(self, data: bytes, target: OutputTarget | None, now: float | None = None) -> None:
        """Write every complete line of what was fed so far; keep the rest (see the class)."""
        self._fed = True
        text = self._decoder.decode(data)
        if not text:
            return
        if not self._pending:
            self._since = time.monotonic() if now is None else now
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
        self._since = time.monotonic() if now is None else now
        prefix = self._prefix(target)
        if "\r" not in lines:  # the common case: one replace for all the lines
            if self._open:  # the first line continues what was written without a newline
                head, _, lines = lines.partition("\n")
                out = head + "\n"
            else:
                out = ""
            if lines:
                out += prefix + lines[:-1].replace("\n", "\n" + prefix) + "\n"
            self._open = self._rewind = False
            self._write(out, target)
        else:
            pieces: list[str] = []
            # A cell's output keeps a terminal's line ends (``!cmd``'s ``\r\n``), as the
            # kernel shows a local cell's.
            crlf = target is not None and target.open_end
            for line in lines[:-1].split("\n"):
                pieces.append(self._render(line, prefix))
                pieces.append("\r\n" if crlf and line.endswith("\r") else "\n")
                self._open = self._rewind = False
            self._write("".join(pieces), target)
        if self._pending_size >= self.cap:
            self._write_pending(target)

    def due(self) -> float | None:
        """When the pending partial line is to be written (``time.monotonic()``), if any."""
        return self._since + self.delay if self._pending else None

    def tick(self, target: OutputTarget | None, now: float | None = None) -> None:
        """Write the pending partial line if it has waited ``delay`` seconds."""
        due = self.due()
        if due is not None and (time.monotonic() if now is None else now) >= due:
            self._write_pending(target)

    def flush(self, target: OutputTarget | None) -> None:
        """End a pending or partly written line with a newline (the task or worker ended);
        a target with ``open_end`` gets the pending text as it is, without one (``print(i,
        end=' ')`` in a cell shows as a local cell's). Either way the next task's output
        starts a line of its own, with its prefix."""
        if not self._fed:
            return  # flushed already, nothing fed since: no pending bytes, no open line
        self._fed = False
        newline = "" if target is not None and target.open_end else "\n"
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._pending.append(tail)
        if self._pending:
            text = "".join(self._pending)
            self._pending, self._pending_size = [], 0
            rendered = self._render(text, self._prefix(target))
            if rendered or newline:
                self._write(rendered + newline, target)
        elif self._open and newline:
            self._write(newline, target)
        self._open = self._rewind = False

    def _write_pending(self, target: OutputTarget | None) -> None:
        text = "".join(self._pending)
        self._pending, self._pending_size = [], 0
        if text.endswith("\r"):  # hold it: a newline may follow (\r\n), or the new state
            text = text.rstrip("\r")
            rewind = True
        else:
            rewind = False
        rendered = self._render(text, self._prefix(target)) if text else ""
        if rendered:
            self._write(rendered, target)
            self._open = True
        self._rewind = rewind or (self._rewind and not rendered)

    def _render(self, text: str, prefix: str) -> str:
        """A piece of the current line as a terminal would leave it (see the class)."""
        if text.endswith("\r"):  # \r\n, split by our newline search
            text = text.rstrip("\r")
        rewrite = self._rewind or "\r" in text
        if "\r" in text:
            states = [part for part in text.split("\r") if part]
            text = states[-1] if states else ""
        if not self._open:
            return prefix + text
        if not text:  # "abc\r" then the newline: the line still reads "abc"
            return ""
        return "\r" + prefix + text if rewrite else text

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
