"""The ``pip`` field's value: parsing, normalising and guarding requirements.

Who calls it: ``PipPlugin.validate`` (at parse time) and ``PipPlugin.create`` (to name the
requirements an installer failure is about). Accepted forms, as in Ray:

- a list of requirement lines (``["six", "attrs>=22"]``);
- a path to a requirements file (read now; ``-r`` includes are inlined, relative paths are
  made absolute against the file);
- ``{"packages": <list or path>, "install_options": [...], "pip_check": bool}``, with Ray's
  names accepted too: ``pip_install_options`` and ``pip_version`` (``pip`` of that version is
  installed into the venv, as Ray does), or for the ``uv`` field ``uv_pip_install_options``,
  ``uv_check`` and ``uv_version`` (recorded; the uv shipped with this package installs).

Every local path is made absolute at parse time, against the spec file (or the requirements
file that names it, or the cwd): requirement paths, ``-r``/``-c``/``-e`` files and the value
of path options (``--find-links``, ``--constraint``, ``--index-url`` when it is not a URL,
...) in ``packages`` lines and in ``install_options``. The installer runs elsewhere, later
(in the agent's build directory, or from a kernelspec installed long before), so nothing
relative may survive parsing. URLs (``scheme://``, ``file:``) are left as they are.

The normal form is always the mapping, with requirements canonicalised (``Six >= 1`` ->
``six>=1``), de-duplicated and sorted, so that equal requests share one venv. Option lines
(``--index-url ...``, ``-e ./pkg``) keep their order, ahead of the requirements.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..spec import files
from ..spec.paths import resolve_path
from ..spec.policy import current_policy
from . import _remote

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

KEYS = ("packages", "install_options", "pip_check")
#: Installer options whose value is a local path (or a URL, kept as is).
PATH_OPTIONS = frozenset(
    {
        *("-f", "--find-links", "-i", "--index-url", "--extra-index-url"),
        *("-c", "--constraint", "-r", "--requirement", "-e", "--editable"),
        *("--override", "--overrides", "--build-constraint", "--build-constraints"),
        *("--cert", "--client-cert", "--src"),
    }
)
#: Options whose file the installer reads as requirement lines.
READ_OPTIONS = frozenset(
    {
        *("-r", "--requirement", "-c", "--constraint", "--override", "--overrides"),
        *("--build-constraint", "--build-constraints"),
    }
)
#: Ray's names for our keys (``pip`` dict, ``uv`` dict), and Ray's keys we add.
RAY_KEYS = {
    "pip_install_options": "install_options",
    "uv_pip_install_options": "install_options",
    "uv_check": "pip_check",
}
VERSION_KEYS = ("pip_version", "uv_version")
ALL_KEYS = (*KEYS, *RAY_KEYS, *VERSION_KEYS)
#: Keys only one of Ray's two fields has (``pip_check`` is also ours).
_RAY_ONLY_KEYS = (
    "pip_install_options",
    "pip_version",
    *(k for k in RAY_KEYS if k[:3] == "uv_"),
    "uv_version",
)
#: Distributions workers import before any user code: a request must not break them.
SELF = "jupyter-runtimeenv"
CLOUDPICKLE = "cloudpickle"

__all__ = [
    "CLOUDPICKLE",
    "KEYS",
    "PATH_OPTIONS",
    "SELF",
    "absolute_options",
    "cloudpickle_floor",
    "names",
    "normalize",
    "split_options",
]


def normalize(value: Any) -> dict[str, Any]:
    """The normal form of a ``pip`` value; ``SpecError`` (relative field) otherwise."""
    if isinstance(value, str):
        return _mapping(_read_file(value, ""), [], False)
    if isinstance(value, list):
        return _mapping(_lines(value, "", None), [], False)
    if not isinstance(value, dict):
        raise SpecError(
            "",
            "expected a list of requirements, a requirements file or a mapping,"
            f" got {_kind(value)}",
        )
    value = _ray_keys(value)
    packages = value.get("packages", [])
    if isinstance(packages, str):
        lines = _read_file(packages, "packages")
    elif isinstance(packages, list):
        lines = _lines(packages, "packages", None)
    else:
        raise SpecError(
            "packages", f"expected a list or a requirements file, got {_kind(packages)}"
        )
    options = value.get("install_options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise SpecError(
            value.get("_options_key", "install_options"),
            "expected a list of strings (installer arguments)",
        )
    options = absolute_options(options)
    _check_install_options(options, value.get("_options_key", "install_options"))
    pip_check = value.get("pip_check", False)
    if not isinstance(pip_check, bool):
        raise SpecError(
            value.get("_check_key", "pip_check"), f"expected true or false, got {_kind(pip_check)}"
        )
    if "packages" not in value:
        raise SpecError("", "a mapping must include 'packages' (as in Ray)")
    if value.get("pip_version"):
        # Ray installs pip<pip_version> into the venv; so do we, as one more requirement.
        lines = [*lines, ("pip_version", "pip" + value["pip_version"], "")]
    result = _mapping(lines, list(options), pip_check)
    if value.get("uv_version"):
        result["uv_version"] = value["uv_version"]
    return result


def _ray_keys(value: dict[Any, Any]) -> dict[str, Any]:
    """``value`` with Ray's key names mapped to ours; unknown keys refused."""
    out: dict[str, Any] = {}
    prefixes = {str(k).split("_", 1)[0] for k in value if k in _RAY_ONLY_KEYS}
    if len(prefixes) > 1:
        raise SpecError("", "mixes pip_* and uv_* keys; Ray's pip field takes pip_*, uv takes uv_*")
    for key, item in value.items():
        if key not in ALL_KEYS:
            raise SpecError(str(key), f"unknown key; known keys are {', '.join(ALL_KEYS)}")
        ours = RAY_KEYS.get(key, key)
        if ours in out:
            raise SpecError(str(key), f"the same as {ours!r} (Ray's name for it); give one")
        if key in VERSION_KEYS:
            if not isinstance(item, str):
                raise SpecError(key, f"expected a version specifier string, got {_kind(item)}")
            item = item.strip()
            if item and item[0].isdigit():
                item = "==" + item
        out[ours] = item
        if ours == "install_options":
            out["_options_key"] = key
        elif ours == "pip_check":
            out["_check_key"] = key
    return out


#: (field path, line, origin): origin is ``line 3 of /x/req.txt`` for a line read from a
#: file, ``""`` for a line of the spec itself.
Line = tuple[str, str, str]


def _mapping(lines: list[Line], options: list[str], pip_check: bool) -> dict[str, Any]:
    option_lines: list[str] = []
    requirements: dict[str, tuple[str, str]] = {}
    for field, line, origin in lines:
        if line.startswith("-") or _is_path(line):
            if line not in option_lines:
                option_lines.append(line)
        else:
            requirements.setdefault(_canonical(line, field, origin), (field, origin))
    for requirement, (field, origin) in requirements.items():
        _guard(requirement, field, origin)
    return {
        "packages": option_lines + sorted(requirements),
        "install_options": options,
        "pip_check": pip_check,
    }


def _lines(items: list[Any], field: str, base: str | None, source: str = "") -> list[Line]:
    """(field path, line, origin) of each requirement line, with ``-r`` files inlined;
    ``source`` names the file ``items`` were read from."""
    out: list[Line] = []
    for i, item in enumerate(items):
        where = f"{field}.{i}" if field else str(i)
        origin = f"line {i + 1} of {source}" if source else ""
        if not isinstance(item, str):
            raise SpecError(where, f"expected a requirement string, got {_kind(item)}")
        line = _strip(item)
        if not line:
            continue
        head, _, rest = line.partition(" ")
        if head in ("-r", "--requirement") or line.startswith("--requirement="):
            target = rest.strip() if rest else line.split("=", 1)[1]
            out.extend(_read_file(_join(base, target), where))
        elif head in PATH_OPTIONS and rest.strip():
            value = _path_value(base, rest.strip())
            _check_read_option(head, value, where)
            out.append((where, f"{head} {value}", origin))
        elif head.split("=", 1)[0] in PATH_OPTIONS and "=" in head:
            name, value = line.split("=", 1)
            value = _path_value(base, value.strip())
            _check_read_option(name, value, where)
            out.append((where, f"{name}={value}", origin))
        elif _is_path(line):
            out.append((where, _join(base, line), origin))
        else:
            out.append((where, line, origin))
    return out


def _check_read_option(option: str, value: str, field: str) -> None:
    """Files the installer reads as requirements (``-c constraints.txt``) are requirement
    files too: under the server's policy, only below its root (an installer's error quotes
    the lines it cannot parse, into a log the sender can read)."""
    if option in READ_OPTIONS and not (value.startswith("file:") or "://" in value):
        try:
            current_policy().check_file(value, "requirements file")
        except SpecError as exc:
            raise exc.within(field) from None
    elif option in READ_OPTIONS and value.startswith("file:"):
        _check_local_uri(value, field)


def _check_local_uri(uri: str, field: str) -> None:
    local = _remote.local_path(uri)
    if local is not None:
        try:
            current_policy().check_file(local, "requirements file")
        except SpecError as exc:
            raise exc.within(field) from None


def _read_file(path: str, field: str) -> list[Line]:
    if _remote.is_remote(path):
        # Read now: its content (not its URI) enters the env id, so an edit rebuilds.
        _check_local_uri(path, field)
        base = path.rsplit("/", 1)[0]
        source = _remote.redact(path)
        return _lines(_remote.read_text(path, field).splitlines(), field, base, source)
    full = resolve_path(path)
    try:
        current_policy().check_file(full, "requirements file")
    except SpecError as exc:
        raise exc.within(field) from None
    try:
        text = files.read_text(full, what="requirements file")
    except files.BadFile as exc:
        raise SpecError(field, str(exc)) from None
    return _lines(text.splitlines(), field, os.path.dirname(full), full)


def _strip(line: str) -> str:
    line = line.strip()
    if line.startswith("#"):
        return ""
    if " #" in line:
        line = line.split(" #", 1)[0].rstrip()
    return line


def _is_path(line: str) -> bool:
    return line.startswith((".", "/", "~", "file:"))


def _path_value(base: str | None, value: str) -> str:
    """The value of a path option made absolute; URLs (``git+https://``, ``file:``) kept."""
    if "://" in value or value.startswith("file:"):
        return value
    return _join(base, value)


def absolute_options(options: list[str], base: str | None = None) -> list[str]:
    """``install_options`` with the value of every path option made absolute, in the form
    given: ``["--find-links", "w"]``, ``["--find-links=w"]`` or ``["--find-links w"]``."""
    out: list[str] = []
    value_of: str | None = None
    for option in options:
        if value_of is not None:
            out.append(_path_value(base, option))
            value_of = None
        elif option.startswith("-") and " " in option:  # one string, split like the installer
            out.append(shlex.join(absolute_options(shlex.split(option), base)))
        elif option in PATH_OPTIONS:
            out.append(option)
            value_of = option
        elif option.split("=", 1)[0] in PATH_OPTIONS and "=" in option:
            name, value = option.split("=", 1)
            out.append(f"{name}={_path_value(base, value)}")
        else:
            out.append(option)
    return out


def _check_install_options(options: list[str], field: str) -> None:
    words = split_options(options)
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if eq and name in READ_OPTIONS:
            _check_read_option(name, value, field)
        elif word in READ_OPTIONS and i + 1 < len(words):
            _check_read_option(word, words[i + 1], field)


def _join(base: str | None, path: str) -> str:
    if path.startswith("file:") or _remote.is_remote(path):
        return path
    if base is not None and _remote.is_remote(base):
        return f"{base}/{path.removeprefix('./')}"  # an include beside a remote file
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded):
        return os.path.normpath(expanded)
    return os.path.normpath(os.path.join(base, expanded)) if base else resolve_path(expanded)


# A requirement line as most are written: a name and plain release versions, one operator
# at most once (``pandas``, ``numpy>=1.26,<3``, ``scikit-learn==1.5.2``), no spaces. Its
# canonical form is spelled here as ``packaging`` spells it (``_canonical_by_packaging``),
# without importing ``packaging`` (~16 ms with its markers, tags, logging and platform: a
# fifth of a CLI build of a cached env); anything else goes to ``packaging``.
# ``tests/plugins/test_requirements_fast.py`` compares the two.
_SIMPLE = re.compile(
    r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r"(?P<specs>(?:(?:==|!=|<=|>=|<|>)[0-9]+(?:\.[0-9]+)*|~=[0-9]+(?:\.[0-9]+)+)"
    r"(?:,(?:(?:==|!=|<=|>=|<|>)[0-9]+(?:\.[0-9]+)*|~=[0-9]+(?:\.[0-9]+)+))*)?",
    re.ASCII,
)
_OPERATOR = re.compile(r"[=!<>~]+")


def _name(name: str) -> str:
    """``packaging.utils.canonicalize_name`` (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _canonical_simple(line: str) -> str | None:
    """The canonical form of a simple line (see ``_SIMPLE``), or None."""
    found = _SIMPLE.fullmatch(line)
    if found is None:
        return None
    specs = found.group("specs")
    text = _name(found.group("name"))
    if not specs:
        return text
    parts = specs.split(",")
    operators = [_OPERATOR.match(part).group() for part in parts]  # type: ignore[union-attr]
    if len(set(operators)) != len(operators):
        return None  # ">=1,>=1.0": equal specifiers that packaging keeps one of
    return text + ",".join(sorted(parts))


def _canonical(line: str, field: str, origin: str = "") -> str:
    simple = _canonical_simple(line)
    return _canonical_by_packaging(line, field, origin) if simple is None else simple


def _canonical_by_packaging(line: str, field: str, origin: str = "") -> str:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        if origin and not current_policy().quote_files:
            # Over REST: never a file's content in the answer (packaging's message quotes it).
            raise SpecError(field, f"{origin} is not a valid requirement") from None
        where = f"{origin}: " if origin else ""
        raise SpecError(field, f"{where}{line!r} is not a valid requirement: {exc}") from None
    text: str = canonicalize_name(req.name)
    if req.extras:
        text += "[" + ",".join(sorted(req.extras)) + "]"
    text += f" @ {req.url}" if req.url else str(req.specifier)
    if req.marker:
        text += f"; {req.marker}"
    return text


def cloudpickle_floor() -> SpecifierSet:
    """What this package itself requires of cloudpickle (its metadata), e.g. ``>=3.0``."""
    from importlib import metadata  # here: ~10 ms, for a spec that names cloudpickle only

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    try:
        for line in metadata.requires(SELF) or []:
            req = Requirement(line)
            if canonicalize_name(req.name) == CLOUDPICKLE and not req.marker:
                return req.specifier
    except metadata.PackageNotFoundError:
        pass
    return SpecifierSet(">=3.0")


def _guard(requirement: str, field: str, origin: str = "") -> None:
    simple = _SIMPLE.fullmatch(requirement)
    if simple is not None and _name(simple.group("name")) not in (SELF, CLOUDPICKLE):
        return  # nothing to guard against, and no need of packaging to say so
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    req = Requirement(requirement)
    shown = (
        origin if origin and not current_policy().quote_files else repr(requirement)
    )  # a line of a file is named, not quoted, over REST
    name = canonicalize_name(req.name)
    if name == SELF:
        raise SpecError(
            field,
            f"{SELF} is provided to every environment by the agent (workers import it);"
            " remove it from the requirements",
        )
    if name == CLOUDPICKLE and not req.url:
        floor = cloudpickle_floor()
        probes = [_installed(CLOUDPICKLE), "3.0.0", "3.1.0", "3.1.2", "3.2", "4.0", "5.0", "9.0"]
        if not any(p and p in floor and p in req.specifier for p in probes):
            raise SpecError(
                field,
                f"{shown} would break the workers, which need cloudpickle{floor}"
                " (they unpickle the tasks with it)",
            )


def _installed(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def names(packages: list[str]) -> list[str]:
    """The project names among requirement lines (options and paths skipped)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for line in packages:
        if line.startswith("-") or _is_path(line):
            continue
        try:
            out.append(Requirement(line).name)
        except InvalidRequirement:
            continue
    return out


def split_options(options: list[str]) -> list[str]:
    """``install_options`` as argv words (``"--index-url X"`` given as one string works)."""
    words: list[str] = []
    for option in options:
        split = option.startswith("-") and " " in option
        words.extend(shlex.split(option) if split else [option])
    return words


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
