"""Content hashing of local files and trees, with a stat-keyed memo.

Who calls it: ``working_dir`` and ``py_modules`` — from ``identity`` and ``uris`` (parse and
the agent, in threads) and from ``create`` (through ``build.to_thread``). Everything here
blocks; nothing here may run on an event loop.

A tree's digest covers each kept file's relative path, mode class and content, after
the default excludes, the spec's ``excludes`` and every ``.gitignore`` in the tree. File
contents are memoised by (path, size, mtime_ns, inode, device), so hashing an unchanged
tree again costs one ``stat`` per file. Like git's "racy" check, a file modified less than
``RACY_SECONDS`` ago is not memoised: a write within the same mtime tick as the hash could
otherwise go unnoticed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..spec.patterns import PatternError, PatternList, check_list

#: Never part of a working_dir or py_module, whatever the spec says.
DEFAULT_EXCLUDES = (".git/", "__pycache__/", ".venv/", ".ipynb_checkpoints/")
RACY_SECONDS = 1.0
#: A ``.gitignore`` larger than this, or with more patterns, is refused (``PatternError``).
MAX_GITIGNORE_BYTES = 1 << 20
MAX_GITIGNORE_PATTERNS = 10_000
_CHUNK = 1 << 20
_MEMO_MAX = 500_000

__all__ = [
    "DEFAULT_EXCLUDES",
    "FileEntry",
    "Tree",
    "blob_mode",
    "hash_file",
    "hash_tree",
]


def blob_mode(st_mode: int) -> int:
    """The read-only mode a file is stored with: the owner reads; group and other read only
    if they could read the source (a 0600 file stays owner-only: 0400); whoever reads may
    execute if the source was executable. The common cases are 0444 and 0555."""
    read = 0o400 | (st_mode & 0o044)
    return read | (read >> 2) if st_mode & 0o111 else read


@dataclass(frozen=True)
class FileEntry:
    """One file of a tree: where it is relative to the tree, its source, the mode it is
    stored with (``blob_mode``) and its content."""

    rel: str
    source: str
    mode: int
    size: int
    sha256: str

    @property
    def executable(self) -> bool:
        return bool(self.mode & 0o100)

    @property
    def blob_name(self) -> str:
        # The mode is part of the blob: hardlinks share their inode's mode, so a 0600 file
        # and a 0644 file of the same content are two blobs (0400 and 0444).
        if self.mode == 0o444:
            return self.sha256
        if self.mode == 0o555:
            return self.sha256 + "-x"
        return f"{self.sha256}-m{self.mode:03o}"


@dataclass(frozen=True)
class Tree:
    """A hashed tree: its digest, its files in path order and their total size."""

    digest: str
    entries: tuple[FileEntry, ...]

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @functools.cached_property
    def dirs(self) -> tuple[str, ...]:
        """Every directory below the root that holds a file, parents before children."""
        found: set[str] = set()
        for entry in self.entries:
            parent = os.path.dirname(entry.rel)
            while parent and parent not in found:
                found.add(parent)
                parent = os.path.dirname(parent)
        return tuple(sorted(found))  # a prefix sorts before its extensions

    def largest(self, n: int = 5) -> list[FileEntry]:
        return sorted(self.entries, key=lambda e: e.size, reverse=True)[:n]


_memo: dict[str, tuple[tuple[int, int, int, int], str]] = {}
_memo_lock = threading.Lock()


def hash_file(path: str, st: os.stat_result | None = None) -> str:
    """The sha256 of a file's content, from the memo when its stat is unchanged."""
    st = st or os.stat(path)
    key = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
    with _memo_lock:
        hit = _memo.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    sha = digest.hexdigest()
    if st.st_mtime_ns < (time.time() - RACY_SECONDS) * 1e9:
        with _memo_lock:
            if len(_memo) >= _MEMO_MAX:
                _memo.clear()
            _memo[path] = (key, sha)
    return sha


# (base dir, patterns, whether any pattern can match a file): patterns ending in "/" match
# directories only, and excluded directories are pruned, so files skip those lists. The
# first matcher of a walk is the spec's (default excludes + ``excludes``); the others are
# ``.gitignore`` files, deeper last.
Matcher = tuple[str, PatternList, bool]


def _matcher(base: str, lines: Iterable[str]) -> Matcher:
    # Linear-time matching, no regular expression (``spec.patterns``): a pattern can never
    # make a walk backtrack for minutes while holding the GIL.
    patterns = PatternList.from_lines(lines)
    return (base, patterns, patterns.files_too)


def _read_gitignore(path: str) -> list[str] | None:
    """The lines of the ``.gitignore`` at ``path``; None if there is none, or if it is not a
    regular file: like git (2.32+), a symlinked ``.gitignore`` is not followed, and a FIFO or
    device is never opened for a blocking read. ``PatternError`` past the bounds."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return None  # absent, a symlink (ELOOP), unreadable
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(MAX_GITIGNORE_BYTES + 1)
    if len(data) > MAX_GITIGNORE_BYTES:
        raise PatternError(f"{path} is larger than {MAX_GITIGNORE_BYTES} bytes")
    lines = [line for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    if len(lines) > MAX_GITIGNORE_PATTERNS:
        raise PatternError(f"{path}: {len(lines)} patterns, more than {MAX_GITIGNORE_PATTERNS}")
    return lines


def hash_tree(root: str | Path, excludes: Sequence[str] = (), *, prefix: str = "") -> Tree:
    """Hash the directory ``root`` (or a single file) after excludes and ``.gitignore``.

    ``prefix`` is put before every relative path (``py_modules`` keeps a package's own name
    so that the resource's root is what goes on ``sys.path``). Symlinks to files are
    followed (their content is what the worker will read); symlinks to directories are not
    (they could loop or leave the tree).
    """
    root = os.path.abspath(root)
    entries: list[FileEntry] = []
    if os.path.isfile(root):
        st = os.stat(root)
        name = prefix or os.path.basename(root)
        entries.append(
            FileEntry(name, root, blob_mode(st.st_mode), st.st_size, hash_file(root, st))
        )
    else:
        check_list(excludes, "excludes")
        base = [_matcher("", [*DEFAULT_EXCLUDES, *excludes])]
        _walk(root, "", base, prefix, entries)
    return Tree(_digest(entries), tuple(entries))


def _walk(
    root: str,
    rel_dir: str,
    matchers: list[Matcher],
    prefix: str,
    out: list[FileEntry],
) -> None:
    dirpath = os.path.join(root, rel_dir) if rel_dir else root
    gitignore = _read_gitignore(os.path.join(dirpath, ".gitignore"))
    if gitignore is not None:
        matchers = [*matchers, _matcher(rel_dir, gitignore)]
    with os.scandir(dirpath) as it:
        children = sorted(it, key=lambda e: e.name)
    for child in children:
        rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
        is_dir = child.is_dir(follow_symlinks=False)
        if _ignored(rel, is_dir, matchers):
            continue
        if is_dir:
            _walk(root, rel, matchers, prefix, out)
            continue
        try:
            st = child.stat(follow_symlinks=True)
        except OSError:
            continue  # a dangling symlink: nothing a worker could read
        if not stat.S_ISREG(st.st_mode):
            continue  # sockets, fifos, symlinks to directories
        out.append(
            FileEntry(
                f"{prefix}/{rel}" if prefix else rel,
                child.path,
                blob_mode(st.st_mode),
                st.st_size,
                hash_file(child.path, st),
            )
        )


def _ignored(rel: str, is_dir: bool, matchers: list[Matcher]) -> bool:
    # The spec's patterns exclude whatever a .gitignore says (as in Ray); among .gitignore
    # files the deepest one with a matching pattern decides, so "!keep" in a subdirectory
    # re-includes what a parent's .gitignore excluded (as in git).
    base, patterns, files_too = matchers[0]
    if (is_dir or files_too) and patterns.match(rel, is_dir):
        return True
    for base, patterns, files_too in reversed(matchers[1:]):
        if not is_dir and not files_too:
            continue
        decision = patterns.decide(rel[len(base) + 1 :] if base else rel, is_dir)
        if decision is not None:
            return decision
    return False


def _digest(entries: Iterable[FileEntry]) -> str:
    h = hashlib.sha256()
    for e in entries:
        h.update(e.rel.encode("utf-8", "surrogateescape"))
        # 0444/0555 hash as before modes were kept; any other mode enters the digest, so
        # making a file owner-only makes a new tree.
        if e.mode in (0o444, 0o555):
            h.update(b"\0755\0" if e.executable else b"\0644\0")
        else:
            h.update(f"\0m{e.mode:03o}\0".encode())
        h.update(e.sha256.encode())
        h.update(b"\n")
    return h.hexdigest()
