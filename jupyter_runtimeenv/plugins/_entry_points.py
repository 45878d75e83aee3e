"""The entry points of one group, read without ``importlib.metadata`` where that is exact.

Who calls it: ``PluginRegistry`` (``registry.py``), once per process, for the plugins' group.
Why: ``importlib.metadata`` costs ~10 ms to import (it parses package metadata with
``email``, opens zip files with ``zipfile``) and ~8 ms to scan a venv of 200 packages,
about a fifth of a CLI build of a cached env and of a kernel's first ``%runtime_env``
(issue 19 items 4 and 5). What the registry needs is one group's ``name -> value``
pairs, and for distributions installed as directories on ``sys.path`` that is a directory
listing and one small file per distribution.

What it reproduces, from Python 3.11's ``importlib.metadata.entry_points(group=...)``: the
distributions are the ``*.dist-info``/``*.egg-info`` entries of each ``sys.path`` directory
in ``sys.path`` order (``''`` is the working directory), within one directory grouped by
normalised name in listing order; of several with one normalised name the first counts;
each one's ``entry_points.txt`` (UTF-8; a missing or unreadable file is none) is read as
``importlib.metadata.Sectioned`` reads it; a name given twice keeps the last value.

Where it would not be exact, it asks ``importlib.metadata`` itself: a finder on
``sys.meta_path`` other than the standard ``PathFinder`` that finds distributions, a
``sys.path`` entry that is a file (a zip), an ``.egg`` directory, a metadata directory whose
extension is not lower case (its name then comes from its metadata), a file that is not
UTF-8 or that ``Sectioned`` would refuse (a line without ``=`` in a section of this group).
``tests/plugins/test_entry_points.py`` compares the two.
"""

from __future__ import annotations

import os
import re
import sys

__all__ = ["entry_points_of"]

_SUFFIXES = (".dist-info", ".egg-info")


class _NotExact(Exception):
    """Something only ``importlib.metadata`` reads as it does."""


def entry_points_of(group: str) -> dict[str, str]:
    """``{name: value}`` of the entry points of ``group``, as ``{ep.name: ep.value for ep in
    importlib.metadata.entry_points(group=group)}`` gives them."""
    try:
        return _scan(group)
    except _NotExact:
        from importlib.metadata import entry_points

        return {ep.name: ep.value for ep in entry_points(group=group)}


def _normalize(name: str) -> str:
    """``importlib.metadata.Prepared.normalize``."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _scan(group: str) -> dict[str, str]:
    from importlib.machinery import PathFinder

    for finder in sys.meta_path:
        if finder is not PathFinder and getattr(finder, "find_distributions", None):
            raise _NotExact(finder)
    seen: set[str] = set()
    found: dict[str, str] = {}
    for entry in list(sys.path):
        root = entry or "."
        try:
            children = os.listdir(root)
        except OSError:
            if os.path.isfile(root):
                raise _NotExact(root) from None  # a zip: importlib.metadata reads into it
            continue  # missing, or not ours to list: no distributions, as there
        if os.path.basename(entry).lower().endswith(".egg"):
            raise _NotExact(entry)
        by_name: dict[str, list[str]] = {}
        for child in children:
            low = child.lower()
            if low.endswith(_SUFFIXES):
                if not child.endswith(_SUFFIXES):
                    raise _NotExact(child)  # its name would be read from its metadata
                name = _normalize(low.rpartition(".")[0].partition("-")[0])
                by_name.setdefault(name, []).append(child)
        for name, metadata_dirs in by_name.items():
            if name in seen:
                continue
            seen.add(name)  # the first of that name counts, the others are not read
            found.update(_section(os.path.join(entry, metadata_dirs[0]), group))
    return found


def _section(metadata_dir: str, group: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of ``group`` in the distribution's ``entry_points.txt``."""
    try:
        with open(os.path.join(metadata_dir, "entry_points.txt"), encoding="utf-8") as file:
            text = file.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        return []
    except (UnicodeDecodeError, OSError):
        raise _NotExact(metadata_dir) from None
    if group not in text:
        return []
    pairs: list[tuple[str, str]] = []
    section = None
    for line in map(str.strip, text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        if section == group:
            name, sep, value = line.partition("=")
            if not sep:
                raise _NotExact(metadata_dir)  # Sectioned fails on it: let it say how
            pairs.append((name.strip(), value.strip()))
    return pairs
