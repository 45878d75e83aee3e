"""A tree laid out while it is hashed: the first lay-out of a new tree on the hashing threads.

Who calls it: ``_hashing._hash_all`` (``Layer``, from its threads) for a caller that passes
``hash_tree`` a ``LayOut``: ``_sources`` at parse time, in the process of an agent, whose
``_spares.adopt`` then makes the lay-out the source's spare, which its build takes (renamed
into the env's target, every file checked before it is kept).

Laying a tree of a thousand files out after hashing it was 1,000 links (20-33 ms on this
ext4) after the hash, on one core, every time a new tree was built; linked by the thread
that has just stored each file, the links run on the cores that hash, and each skips the
``lstat`` of its blob that a later lay-out makes (the thread has just written or checked it).
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass

from ._blobs import relative

__all__ = ["LayOut", "Layer"]


@dataclass
class LayOut:
    """A directory (not there yet) where ``hash_tree`` lays the tree out, as links to the
    store's blobs, while it hashes. ``done``: it did (every file of the tree was read by that
    call, and linked); otherwise nothing is left at ``path``."""

    path: str
    done: bool = False


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Layer:
    """A ``LayOut`` being made: its directories first, then a link per stored file from any
    hashing thread (``os.link`` relative to descriptors of the store and of the root). Each
    user (every hashing slice and the caller) lets go once with ``release``; the last one
    closes the descriptors, so none is closed under a link still being made."""

    def __init__(self, path: str, store_fd: int, root_fd: int, users: int) -> None:
        self.path = path
        self.store_fd = store_fd
        self.root_fd = root_fd
        self.failed = False
        self._users = users
        self._lock = threading.Lock()

    @classmethod
    def make(cls, path: str, store: str, rels: list[str], threads: int) -> Layer | None:
        """The lay-out's root and directories for ``threads`` slices and the caller, or None
        (nothing left) if they cannot be made: it is an optimisation."""
        dirs: set[str] = set()
        for rel in rels:
            parent = os.path.dirname(rel)
            while parent and parent not in dirs:
                dirs.add(parent)
                parent = os.path.dirname(parent)
        fds: list[int] = []
        try:
            os.makedirs(store, exist_ok=True)  # its first blobs are about to be stored
            os.mkdir(path)
            fds.append(os.open(store, _DIR_FLAGS))
            fds.append(os.open(path, _DIR_FLAGS))
            for rel_dir in sorted(dirs):  # parents first (a prefix sorts first)
                os.mkdir(rel_dir, dir_fd=fds[1])
        except OSError:
            for fd in fds:
                os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            return None
        return cls(path, fds[0], fds[1], threads + 1)

    def link(self, rel: str, name: str) -> None:
        """Link blob ``name`` (just stored or checked by the calling thread) as ``rel``."""
        if self.failed:
            return
        try:
            os.link(relative(name), rel, src_dir_fd=self.store_fd, dst_dir_fd=self.root_fd)
        except OSError:  # another file system, too many links, no blob: no lay-out
            self.failed = True

    def release(self, ok: bool) -> bool:
        """Let go (``ok``: this user's part went well); returns whether the lay-out is whole
        so far. The last user closes it, and removes it unless it is whole."""
        with self._lock:
            if not ok:
                self.failed = True
            self._users -= 1
            last = self._users == 0
            whole = not self.failed
        if last:
            os.close(self.store_fd)
            os.close(self.root_fd)
            if not whole:
                shutil.rmtree(self.path, ignore_errors=True)
        return whole
