"""Large buffers through shared memory (issue 19 item 5): out of band both ways, no copy
on the receiving side, and no segment left behind by any path — a normal call, a worker's
death, a cancel, a SIGKILLed driver.

``Blob`` stands for a numpy array (the test environment has no numpy): pickle protocol 5
hands its buffer to the callback, and the unpickled one keeps the buffer it is given.
"""

from __future__ import annotations

import gc
import hashlib
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_runtimeenv.errors import BrokenWorker
from jupyter_runtimeenv.workers import shm
from jupyter_runtimeenv.workers.channel import driver_arena
from jupyter_runtimeenv.workers.future import RemoteFuture, Task
from jupyter_runtimeenv.workers.output import OutputTarget
from jupyter_runtimeenv.workers.pool import Pool
from jupyter_runtimeenv.workers.serialize import prepare_call
from tests.workers.helpers import wait_gone

MakePool = Callable[..., Pool]
SIZE = 3 * shm.OOB_MIN


class Blob:
    def __init__(self, data: Any) -> None:
        self.data = memoryview(data).cast("B")

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (Blob, (pickle.PickleBuffer(self.data),))

    def shared(self) -> bool:
        """Whether the buffer is a view of shared memory (not a copy)."""
        return type(self.data.obj).__name__.startswith("c_char_Array")

    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def submit(pool: Pool, function: Callable[..., Any], *args: Any) -> RemoteFuture[Any]:
    """What ``LocalExecutor.submit`` does: arguments' large buffers into the arena."""
    future: RemoteFuture[Any] = RemoteFuture(function.__name__)
    call = prepare_call(0, function, args, {}, function.__name__, driver_arena())
    assert pool.submit(Task.of(call, future, OutputTarget.capture(function.__name__)))
    return future


def inspect(blob: Blob) -> tuple[bool, str, Blob]:
    """In the worker: was the argument shared, its digest; scribble on it; send it back."""
    digest = blob.digest()
    shared = blob.shared()
    blob.data[0] ^= 0xFF  # writable, and private to this call
    return shared, digest, Blob(bytearray(blob.data))


def hold(blob: Blob, marker: str) -> None:
    write_whole(marker, str(os.getpid()))
    time.sleep(60)


def write_whole(path: str, text: str) -> None:
    """Write ``text`` so that a reader polling for ``path`` never sees part of it."""
    part = Path(f"{path}.{os.getpid()}.part")
    part.write_text(text)
    part.rename(path)


def wait_for(condition: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def mapped(name: str, pid: int | str = "self") -> list[str]:
    try:
        return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if name in line]
    except OSError:  # gone meanwhile
        return []


def dev_shm() -> set[str]:
    """Our names in /dev/shm (other programs on this machine use it too)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {name for name in names if "jupyter-runtimeenv" in name}


@pytest.fixture(autouse=True)
def nothing_left_in_dev_shm() -> Any:
    before = dev_shm()
    yield
    assert dev_shm() <= before


def test_large_buffers_go_both_ways_without_a_copy_on_arrival(make_pool: MakePool) -> None:
    pool = make_pool(max_workers=1)
    data = bytearray(os.urandom(SIZE))
    original = Blob(data)
    for _ in range(3):  # the same segments each time: FREE comes back with the answer
        shared, digest, back = submit(pool, inspect, original).result(60)
        assert shared
        assert digest == original.digest()
        assert back.shared()  # the result is a view of the worker's segment
        assert bytes(back.data[1:]) == bytes(data[1:])
        assert back.data[0] == data[0] ^ 0xFF  # what the worker wrote, not our copy
        del back
    assert len(driver_arena().live()) >= 1
    wait_for(lambda: driver_arena().busy() == 0)
    gc.collect()


def test_small_buffers_stay_in_the_pickle(make_pool: MakePool) -> None:
    pool = make_pool(max_workers=1)
    small = Blob(bytearray(shm.OOB_MIN - 1))
    shared, _, back = submit(pool, inspect, small).result(60)
    assert not shared
    assert not back.shared()


def test_a_result_outlives_its_worker_and_its_mapping_goes_with_it(make_pool: MakePool) -> None:
    pool = make_pool(max_workers=1)
    _, _, back = submit(pool, inspect, Blob(bytearray(SIZE))).result(60)
    pool.close()
    assert back.data[0] == 0xFF  # still readable: the mapping is ours
    assert mapped("jupyter-runtimeenv-result")
    del back
    gc.collect()
    assert not mapped("jupyter-runtimeenv-result")


def test_a_worker_that_dies_holding_an_argument_gives_its_segment_back(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = make_pool(max_workers=1)
    marker = tmp_path / "pid"
    future = submit(pool, hold, Blob(bytearray(SIZE)), str(marker))
    wait_for(marker.exists)
    worker = int(marker.read_text())
    assert driver_arena().busy() >= 1
    os.kill(worker, signal.SIGKILL)
    with pytest.raises(BrokenWorker):
        future.result(60)
    wait_for(lambda: driver_arena().busy() == 0)
    wait_gone([worker])


def test_cancelled_calls_give_their_segments_back(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(max_workers=1)
    marker = tmp_path / "pid"
    running = submit(pool, hold, Blob(bytearray(SIZE)), str(marker))
    queued = submit(pool, hold, Blob(bytearray(SIZE)), str(tmp_path / "never"))
    wait_for(marker.exists)
    assert driver_arena().busy() >= 2
    assert queued.cancel()
    assert running.cancel()  # its worker is killed
    wait_for(lambda: driver_arena().busy() == 0)
    wait_gone([int(marker.read_text())])


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    sys.path[:0] = {paths!r}
    from test_shared_memory import Blob, hold, submit
    from jupyter_runtimeenv.context import EnvContext
    from jupyter_runtimeenv.workers.executor import resolve_driver_sys_path
    from jupyter_runtimeenv.workers.pool import Pool
    ctx = EnvContext(python=sys.executable, driver_sys_path=resolve_driver_sys_path())
    pool = Pool(lambda: ctx, max_workers=1)
    future = submit(pool, hold, Blob(bytearray({size})), {marker!r})
    time.sleep(600)
    """
)


def test_a_sigkilled_driver_leaves_no_segment_behind(tmp_path: Path) -> None:
    """The kernel dies (SIGKILL) while its worker holds a large argument: once the worker
    has followed it (parent-death watchdog), no process maps or holds any segment."""
    marker = tmp_path / "pid"
    here = str(Path(__file__).parent)
    script = DRIVER.format(paths=[here, *sys.path], size=SIZE, marker=str(marker))
    driver = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(marker.exists)
        worker = int(marker.read_text())
        name = f"jupyter-runtimeenv-args-{driver.pid}"
        assert mapped(name, driver.pid)
        assert mapped(name, worker)
    finally:
        driver.kill()
        driver.wait()
    wait_gone([worker], timeout=30)
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        assert not mapped(name, pid), f"process {pid} still maps {name}"
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        assert not [link for link in links if name in link], f"process {pid} holds {name}"


def on_shared_pages(array: Any) -> bool:
    """Whether a numpy array's memory is a view of a buffer we handed out (a segment's), not
    memory numpy allocated."""
    while getattr(array, "base", None) is not None and type(array.base).__module__ == "numpy":
        array = array.base
    return isinstance(array.base, memoryview)


def frame_stats(frame: Any) -> tuple[bool, float, Any]:
    return on_shared_pages(frame["a"].to_numpy()), float(frame["a"].sum()), frame * 2


def test_numpy_and_pandas_use_the_shared_pages(make_pool: MakePool) -> None:
    """The worker's DataFrame is built on the segment's pages (no copy), and so is the
    driver's result; both match what a local call gives."""
    import numpy as np  # the test extra has both
    import pandas as pd

    pool = make_pool(max_workers=1)
    frame = pd.DataFrame({"a": np.arange(SIZE // 8, dtype=np.float64), "b": 1.0})
    shared, total, doubled = submit(pool, frame_stats, frame).result(60)
    assert shared
    assert total == float(frame["a"].sum())
    assert doubled.equals(frame * 2)
    assert on_shared_pages(doubled["a"].to_numpy())
    array = np.arange(SIZE // 8, dtype=np.int64)
    back = submit(pool, np.negative, array).result(60)
    assert (back == -array).all()
    assert on_shared_pages(back)
    back[0] = 7  # writable: the result is ours
    assert not on_shared_pages(np.negative(array))  # the test tells copies apart
