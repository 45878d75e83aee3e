"""Worker output: long lines, split characters, bad bytes, both streams (issue 8, item 10).

The contract (``StreamForwarder``): each line arrives once, as ``(name pid=N) line\\n``; a
line longer than the cap is written in pieces as it comes (prefix on the first piece only),
so the text that arrives is still exactly the prefix, the line and a newline. A partial line
is written once it waited the delay, and ``\\r`` renders as the line's last state with the
prefix kept (issue 21 item 7). Speed is measured in ``benchmarks/bench_output.py``, not here.
"""

from __future__ import annotations

import contextvars
import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import LINE_CAP, OutputTarget, StreamForwarder
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import dump_call


class Recorder(io.StringIO):
    """A stream that keeps every ``write`` call apart, to see what was written when."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def target(name: str = "t") -> tuple[OutputTarget, Recorder, Recorder]:
    out, err = Recorder(), Recorder()
    return OutputTarget(name, out, err, contextvars.copy_context()), out, err


def test_a_long_line_is_written_in_pieces_as_it_comes_and_arrives_whole() -> None:
    sink, out, _ = target()
    forwarder = StreamForwarder(1, 42)
    line = (b"0123456789" * (LINE_CAP // 5))[: 3 * LINE_CAP + 17]
    chunks = [line[i : i + 1000] for i in range(0, len(line), 1000)]
    for chunk in chunks[: (LINE_CAP // 1000) + 2]:
        forwarder.feed(chunk, sink)
    assert out.writes  # past the cap: the first piece is out before the line ends
    assert out.writes[0].startswith("(t pid=42) 0123")
    for chunk in chunks[(LINE_CAP // 1000) + 2 :]:
        forwarder.feed(chunk, sink)
    forwarder.feed(b"\nnext\n", sink)
    assert out.getvalue() == f"(t pid=42) {line.decode()}\n(t pid=42) next\n"
    assert sum(w.count("(t pid=42)") for w in out.writes) == 2


def test_lines_split_anywhere_arrive_in_order() -> None:
    sink, out, _ = target()
    forwarder = StreamForwarder(1, 7, cap=8)
    data = b"a\nbb\n\nccccccccccccccccccc\nd"
    for i in range(len(data)):  # one byte at a time: the worst split
        forwarder.feed(data[i : i + 1], sink)
    forwarder.flush(sink)
    p = "(t pid=7) "
    assert out.getvalue() == f"{p}a\n{p}bb\n{p}\n{p}ccccccccccccccccccc\n{p}d\n"


def test_split_characters_and_invalid_bytes() -> None:
    sink, out, _ = target()
    forwarder = StreamForwarder(1, 1, cap=4)
    euro = "€".encode()
    forwarder.feed(b"price " + euro[:1], sink)
    forwarder.feed(euro[1:] + b" \xff\xfe ok\n", sink)
    forwarder.feed(b"cut " + euro[:2], sink)
    forwarder.flush(sink)  # the task ended inside a character
    assert out.getvalue() == "(t pid=1) price € \ufffd\ufffd ok\n(t pid=1) cut \ufffd\n"


def test_flush_ends_a_line_written_in_pieces() -> None:
    sink, out, err = target()
    forwarder = StreamForwarder(2, 3, cap=4)
    forwarder.feed(b"abcdefgh", sink)
    assert err.writes == ["(t pid=3) abcdefgh"]
    forwarder.flush(sink)
    forwarder.flush(sink)  # nothing pending: nothing written
    assert err.writes == ["(t pid=3) abcdefgh", "\n"]
    assert out.getvalue() == ""


def big_line(size: int) -> int:
    """Worker side: one ``size``-byte line, stderr in between, no final newline."""
    sys.stdout.write("L" * (size // 2))
    sys.stderr.write("warn 1\n")
    sys.stdout.write("M" * (size - size // 2))
    sys.stdout.write("\nafter")  # no newline at the end of the task
    sys.stderr.write("warn 2")
    return os.getpid()


def raw_bytes() -> int:
    os.write(1, b"bin \xff\xfe\x00 end\n")
    os.write(1, b"half " + "€".encode()[:2])
    os.write(1, "€".encode()[2:] + b"\n")
    return os.getpid()


def run(pool: Pool, function: Callable[..., int], *args: object) -> tuple[int, str, str]:
    name = function.__name__
    sink, out, err = target(name)
    future: RemoteFuture[int] = RemoteFuture(name)
    task = Task(b"", future, sink)
    task.payload = dump_call(task.id, function, args, {}, name)
    assert pool.submit(task)
    pid = future.result(120)
    return pid, out.getvalue(), err.getvalue()


def test_a_ten_megabyte_line_from_a_worker(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_workers=1)
    size = 10 << 20
    pid, out, err = run(pool, big_line, size)
    p = f"(big_line pid={pid}) "
    assert len(out) == len(p) * 2 + size + len("\nafter\n")
    assert out == p + "L" * (size // 2) + "M" * (size - size // 2) + "\n" + p + "after\n"
    assert err == f"{p}warn 1\n{p}warn 2\n"
    # The worker is fine afterwards, and the next task's output is its own.
    again, out, _ = run(pool, raw_bytes)
    assert again == pid
    assert out == f"(raw_bytes pid={pid}) bin \ufffd\ufffd\x00 end\n(raw_bytes pid={pid}) half €\n"


def shout(word: str) -> int:
    print(word * 1000, end="")  # a partial line, flushed at the task's end
    return os.getpid()


def test_concurrent_tasks_each_get_their_own_output(make_pool: Callable[..., Pool]) -> None:
    pool = make_pool(max_workers=2)
    runs = []
    for i in range(20):
        sink, out, _ = target(f"shout{i}")
        future: RemoteFuture[int] = RemoteFuture(f"shout{i}")
        task = Task(b"", future, sink)
        task.payload = dump_call(task.id, shout, (str(i % 10),), {}, "shout")
        assert pool.submit(task)
        runs.append((i, future, out))
    for i, future, out in runs:
        pid = future.result(30)
        assert out.getvalue() == f"(shout{i} pid={pid}) {str(i % 10) * 1000}\n"


def terminal(text: str) -> list[str]:
    """``text`` as a terminal (or a Jupyter frontend) leaves it: each line's last state."""
    return [([part for part in line.split("\r") if part] or [""])[-1] for line in text.split("\n")]


def test_a_partial_line_is_written_once_it_waited_the_delay() -> None:
    sink, out, _ = target()
    forwarder = StreamForwarder(1, 5, delay=0.1)
    forwarder.feed(b"\r 10%", sink, now=0.0)
    forwarder.tick(sink, now=0.05)
    assert out.writes == []  # not yet due
    assert forwarder.due() == 0.1
    forwarder.tick(sink, now=0.1)
    assert out.writes == ["(t pid=5)  10%"]
    assert forwarder.due() is None
    # A bar that rewrites itself fast: one write per delay, its last state only.
    forwarder.feed(b"\r 20%", sink, now=0.2)
    forwarder.feed(b"\r 30%\r 40%", sink, now=0.25)
    forwarder.tick(sink, now=0.31)
    assert out.writes[-1] == "\r(t pid=5)  40%"
    forwarder.feed(b"\r100%\n", sink, now=0.4)
    assert out.writes[-1] == "\r(t pid=5) 100%\n"
    assert terminal(out.getvalue()) == ["(t pid=5) 100%", ""]


def test_carriage_returns_render_as_the_line_s_last_state() -> None:
    sink, out, _ = target()
    forwarder = StreamForwarder(1, 2)
    forwarder.feed(b"draft\rfinal\nwin\r\nlines\r\n", sink)
    assert out.getvalue() == "(t pid=2) final\n(t pid=2) win\n(t pid=2) lines\n"
    # A lone \r at a piece's end: the line reads as it was until new text comes.
    forwarder.feed(b"abc\r", sink, now=0.0)
    forwarder.tick(sink, now=1.0)
    assert out.writes[-1] == "(t pid=2) abc"
    forwarder.feed(b"\n", sink)
    assert out.writes[-1] == "\n"
    forwarder.feed(b"abc\r", sink, now=2.0)
    forwarder.tick(sink, now=3.0)
    forwarder.feed(b"de", sink, now=3.0)
    forwarder.tick(sink, now=4.0)
    assert out.writes[-1] == "\r(t pid=2) de"
    forwarder.flush(sink)
    assert terminal(out.getvalue())[-2:] == ["(t pid=2) de", ""]


def progress_then_wait(flag: str) -> int:
    """Worker side: a progress line without its newline, then wait for the test's flag."""
    import time

    print("\r 50%", end="", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    print("\r100%")
    return os.getpid()


def test_a_progress_line_shows_while_the_task_runs(
    make_pool: Callable[..., Pool], tmp_path: Path
) -> None:
    pool = make_pool(max_workers=1)
    sink, out, _ = target("bar")
    future: RemoteFuture[int] = RemoteFuture("bar")
    task = Task(b"", future, sink)
    flag = tmp_path / "go"
    task.payload = dump_call(task.id, progress_then_wait, (str(flag),), {}, "bar")
    assert pool.submit(task)
    deadline = time.monotonic() + 60
    while "50%" not in out.getvalue():  # it cannot end before the flag exists
        assert time.monotonic() < deadline, "the partial line never arrived"
        time.sleep(0.01)
    assert not future.done()
    flag.touch()
    pid = future.result(60)
    assert out.getvalue() == f"(bar pid={pid})  50%\r(bar pid={pid}) 100%\n"
