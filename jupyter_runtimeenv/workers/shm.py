"""Large buffers between the driver and its local workers through shared memory.

Pickle protocol 5 hands large buffers (numpy arrays, pandas blocks, bytearrays) to a
callback instead of copying them into the pickle. Those of at least ``OOB_MIN`` bytes are
copied once into a *segment* of the sender's ``Arena`` (a memfd, mapped by both sides) and
the frame names them by ``(segment, offset, length)``; the receiver unpickles with views of
its own mapping, so the objects it builds (a numpy array, a DataFrame) use the shared pages
without another copy. What it costs: one ``memcpy`` per direction into pages that are
already there once a segment has been used (``benchmarks/run.py`` W10).

Life of a segment:

- the sender takes a free segment big enough (best fit) or makes a new one, copies one
  call's (or one result's) buffers into it, page-aligned, and sends the frame; the first
  frame that names a segment to a receiver carries its descriptor (``SCM_RIGHTS``);
- the receiver maps a segment once and keeps the mapping (its page tables stay warm for the
  next use); every buffer it hands out is a ``ctypes`` view of that mapping whose finalizer
  counts it down; when the last one is gone the receiver says FREE and the sender may use
  the segment again;
- a sender keeps free segments up to ``WARM_BYTES`` in all; beyond that it truncates the
  oldest to zero (their memory returns to the system at once, whoever maps them) and tells
  receivers to drop them (DROP).

Nothing is named in ``/dev/shm``: a memfd lives as long as a descriptor or a mapping of it,
so a worker's death, a cancelled call or a SIGKILLed kernel leaves no segment behind. Both
sides use this module; the worker loads it by file path, so it imports only the standard
library (``ctypes`` and ``weakref`` when the first large buffer arrives).
"""

from __future__ import annotations

import _thread
import mmap
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

#: Buffers at least this large go through shared memory; smaller ones stay in the pickle.
OOB_MIN = 1 << 20
#: Free segments kept for reuse per arena (beyond: truncated, their memory returned).
WARM_BYTES = 256 << 20
#: Segments are sized in steps of this, so that the next call of a similar size fits.
_STEP = 1 << 20
_ALIGN = mmap.PAGESIZE


def memfd(name: str, size: int) -> int:
    """An anonymous file of ``size`` bytes (a memfd; else an unlinked file in ``/dev/shm``)."""
    create = getattr(os, "memfd_create", None)
    if create is not None:
        try:
            fd: int = create(name, os.MFD_CLOEXEC)
        except OSError:
            fd = _unlinked(name)
    else:
        fd = _unlinked(name)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlinked(name: str) -> int:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    path = os.path.join(base, f".{name}-{os.getpid()}-{id(object())}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.unlink(path)
    return fd


def aligned(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


class Segment:
    """One memfd of an arena, mapped read-write by its sender."""

    __slots__ = ("fd", "id", "map", "size")

    def __init__(self, segment_id: int, size: int, name: str) -> None:
        self.id = segment_id
        self.size = size
        self.fd = memfd(f"{name}-{segment_id}", size)
        try:
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        try:  # noqa: SIM105 - contextlib is not imported before it is needed
            os.ftruncate(self.fd, 0)  # frees the pages now, even where a receiver maps them
        except OSError:
            pass
        try:  # noqa: SIM105
            self.map.close()
        except (BufferError, ValueError):
            pass
        os.close(self.fd)


class Arena:
    """The sending side: copies buffers into segments and takes segments back when freed.

    Thread-safe (``put`` runs in submitting threads, ``free`` in reader threads).
    """

    def __init__(self, name: str, warm_bytes: int = WARM_BYTES, tell_drops: bool = False) -> None:
        self.name = name
        self.warm_bytes = warm_bytes
        #: Keep the ids of dropped segments for ``take_dropped`` (one receiver: a worker's
        #: arena; the driver's, shared by workers, is compared with ``live()`` instead).
        self.tell_drops = tell_drops
        self._lock = _thread.allocate_lock()
        self._next = 1
        self._busy: dict[int, Segment] = {}
        self._free: list[Segment] = []  # oldest first
        #: Segments truncated and closed since the last ``take_dropped`` (for DROP frames).
        self._dropped: list[int] = []
        self.closed = False

    def put(self, buffers: Sequence[memoryview]) -> tuple[Segment, list[tuple[int, int, int]]]:
        """Copy ``buffers`` into one segment; its spans ``(segment id, offset, length)``."""
        offsets = []
        total = 0
        for buffer in buffers:
            offsets.append(total)
            total += aligned(buffer.nbytes)
        segment = self._take(max(total, _ALIGN))
        view = memoryview(segment.map)
        try:
            for buffer, offset in zip(buffers, offsets, strict=True):
                view[offset : offset + buffer.nbytes] = buffer.cast("B")
        except BaseException:
            view.release()
            self.free(segment.id)
            raise
        view.release()
        return segment, [(segment.id, o, b.nbytes) for o, b in zip(offsets, buffers, strict=True)]

    def _take(self, size: int) -> Segment:
        with self._lock:
            if self.closed:
                raise OSError("the shared memory arena is closed")
            fits = [s for s in self._free if s.size >= size]
            if fits:
                best = min(fits, key=lambda s: s.size)
                self._free.remove(best)
                self._busy[best.id] = best
                return best
            segment_id, self._next = self._next, self._next + 1
        segment = Segment(segment_id, -(-size // _STEP) * _STEP, self.name)
        with self._lock:
            self._busy[segment.id] = segment
        return segment

    def fd(self, segment_id: int) -> int:
        with self._lock:
            return self._busy[segment_id].fd

    def free(self, segment_id: int) -> None:
        """The receiver let the segment go (or died): it may be used again."""
        drop: list[Segment] = []
        with self._lock:
            segment = self._busy.pop(segment_id, None)
            if segment is None:
                return
            if self.closed:
                drop.append(segment)
            else:
                self._free.append(segment)
                kept = sum(s.size for s in self._free)
                while kept > self.warm_bytes and self._free:
                    oldest = self._free.pop(0)
                    kept -= oldest.size
                    drop.append(oldest)
            if self.tell_drops:
                self._dropped.extend(s.id for s in drop)
        for segment in drop:
            segment.close()

    def trim(self) -> None:
        """Close every free segment now (a pool closed: their memory goes back)."""
        with self._lock:
            free, self._free = self._free, []
            if self.tell_drops:
                self._dropped.extend(s.id for s in free)
        for segment in free:
            segment.close()

    def live(self) -> set[int]:
        """Ids of the segments that exist (in use or free)."""
        with self._lock:
            return {*self._busy, *(s.id for s in self._free)}

    def take_dropped(self) -> list[int]:
        with self._lock:
            dropped, self._dropped = self._dropped, []
        return dropped

    def busy(self) -> int:
        with self._lock:
            return len(self._busy)

    def close(self) -> None:
        """Close every free segment now and every busy one as it is freed."""
        with self._lock:
            self.closed = True
            free, self._free = self._free, []
        for segment in free:
            segment.close()


class Mappings:
    """The receiving side: segments mapped once, views of them with finalizers.

    A use of a segment (one call's arguments, one result) starts with ``hold`` when its
    frame arrives and ends with ``unhold`` once it is unpickled (or skipped); ``views``
    returns one buffer per span, each holding the segment until it is garbage. When nothing
    holds a segment any more its id is queued in ``freed`` (the owner sends FREE): exactly
    one FREE per use, so the sender never takes back a segment that is in use again.
    Finalizers run in whatever thread drops the last reference: they only lock and append.
    """

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._maps: dict[int, mmap.mmap] = {}
        self._uses: dict[int, int] = {}
        self.freed: list[int] = []
        self.on_free: Callable[[], None] | None = None

    def attach(self, segment_id: int, fd: int) -> None:
        """Map a segment the peer just sent (closes ``fd``: the mapping keeps the file)."""
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        with self._lock:
            self._maps[segment_id] = mapped

    def knows(self, segment_id: int) -> bool:
        return segment_id in self._maps

    def hold(self, segment_ids: Iterable[int]) -> None:
        with self._lock:
            for segment_id in segment_ids:
                self._uses[segment_id] = self._uses.get(segment_id, 0) + 1

    def unhold(self, segment_ids: Iterable[int]) -> None:
        for segment_id in segment_ids:
            self._release(segment_id)

    def views(self, spans: Sequence[tuple[int, int, int]]) -> list[memoryview]:
        """A buffer per span (the segments must be held by the caller meanwhile)."""
        import ctypes
        import weakref

        out = []
        for segment_id, offset, length in spans:
            with self._lock:
                mapped = self._maps.get(segment_id)
                if mapped is None or offset + length > len(mapped):
                    raise ValueError(f"span {offset}+{length} is outside segment {segment_id}")
                if length == 0:
                    out.append(memoryview(b""))
                    continue
                self._uses[segment_id] = self._uses.get(segment_id, 0) + 1
            exporter = (ctypes.c_char * length).from_buffer(mapped, offset)
            weakref.finalize(exporter, self._release, segment_id)
            out.append(memoryview(exporter).cast("B"))
        return out

    def _release(self, segment_id: int) -> None:
        with self._lock:
            left = self._uses[segment_id] - 1
            if left:
                self._uses[segment_id] = left
                return
            del self._uses[segment_id]
            self.freed.append(segment_id)
        callback = self.on_free
        if callback is not None:
            callback()

    def take_freed(self) -> list[int]:
        with self._lock:
            freed, self.freed = self.freed, []
        return freed

    def drop(self, segment_id: int) -> None:
        """The sender truncated the segment: forget the mapping (unmapped when unused)."""
        with self._lock:
            self._maps.pop(segment_id, None)

    def close(self) -> None:
        with self._lock:
            self._maps.clear()
