"""The driver's installed versions as constraints of a layered ``pip`` env (issue 20 item 9).

Who calls it: ``pip.PipPlugin._install``, for an env layered over the driver's environment
(not ``config.isolated``). Without constraints the installer resolves the newest versions,
so the env gets its own copies of packages the kernel already has, in other versions
(pandas 2.2 in the env, 3.1 in the kernel; python-dateutil even unpinned), and objects
passed between them fail to unpickle. With them, every package the driver has is pinned to
its version, except those the request itself asks for with a specifier that version does not
meet (``pandas<3`` with a kernel on 3.1): the spec pins otherwise, the spec wins. When the
request cannot be resolved with them (a dependency needs a newer version than the kernel's),
the plugin installs again without them and says so in the build log.

The versions are read from the distributions' metadata in the parent's site directories
(first one found wins, in ``sys.path`` order), without running its interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = ["installed_versions", "pins_for"]


def installed_versions(site_dirs: Iterable[str]) -> dict[str, str]:
    """``{canonical name: version}`` of the distributions in ``site_dirs``.

    A ``name-version.dist-info`` directory with its METADATA gives both from its name, as
    installers write it (the wheel spec's escaped name and normalised version); anything
    else (``.egg-info``, an odd name) is read as importlib.metadata reads it. Parsing every
    METADATA took 0.3-0.6 s for a kernel's 194 packages, in every build of a layered env.
    """
    found: dict[str, str] = {}
    for directory in site_dirs:
        try:
            entries = os.listdir(directory or ".")
        except OSError:
            continue
        for entry in entries:
            lower = entry.lower()
            if not lower.endswith((".dist-info", ".egg-info")):
                continue
            path = os.path.join(directory, entry)
            pair = _from_dirname(entry, path) or _from_metadata(path)
            if pair is not None:
                found.setdefault(canonicalize_name(pair[0]), pair[1])
    return found


def _from_dirname(entry: str, path: str) -> tuple[str, str] | None:
    if not entry.endswith(".dist-info"):
        return None
    parts = entry[: -len(".dist-info")].split("-")
    if len(parts) != 2 or not all(parts):
        return None
    if not os.path.isfile(os.path.join(path, "METADATA")):
        return None  # a broken .dist-info: not a constraint
    return parts[0], parts[1]


def _from_metadata(path: str) -> tuple[str, str] | None:
    from importlib import metadata  # ~10 ms: only for a name the directory's does not give

    try:
        dist = metadata.Distribution.at(path)
        name, version = dist.metadata["Name"], dist.version
    except Exception:  # a broken .dist-info: not a constraint
        return None
    if not name or not version:
        return None
    return name, version


def pins_for(installed: dict[str, str], requested: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(constraint lines, names the request pins otherwise)``.

    A package the request names with a specifier its installed version meets (or with none)
    stays pinned to that version; one it pins otherwise, or asks for by URL, is left free.
    """
    asked: dict[str, SpecifierSet | None] = {}
    for line in requested:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue  # an option line or a path: it names no version
        key = canonicalize_name(requirement.name)
        if requirement.url:
            asked[key] = None
            continue
        previous = asked.get(key, SpecifierSet())
        asked[key] = None if previous is None else previous & requirement.specifier
    lines: list[str] = []
    free: list[str] = []
    for name in sorted(installed):
        version = installed[name]
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue  # a legacy version string cannot be a constraint
        if name in asked:
            specifier = asked[name]
            if specifier is None or not specifier.contains(parsed, prereleases=True):
                free.append(name)
                continue
        lines.append(f"{name}=={version}")
    return lines, free
