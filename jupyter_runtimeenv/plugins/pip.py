"""``pip`` (and Ray's ``uv``): a venv with the requested packages, layered over the driver's
environment by default (``driver_python``, which the driver fills in; else the agent's).

Who calls it: ``spec.parse`` (``validate``) and the agent (``uris``, ``create``,
``modify_context``). The venv is made with ``uv venv --relocatable`` directly in the build's
target (the agent renames it into the cache), packages go in with ``uv pip install`` from a
package cache shared by every env of the cache root (hardlinks), or with pip when
``config.installer`` is ``"pip"``. The installer's output streams into the env's log.

Layering: a ``.pth`` file in the venv's site-packages runs ``site.addsitedir`` on the
site-packages of the interpreter the venv is made from (``driver_python``, else the agent's), so
the order is the venv's packages, then that parent env's (its ``.pth`` files included:
editable installs work), then its base interpreter's. ``--system-site-packages`` would layer
over the *base* interpreter instead, skipping the venv the driver runs in.
``config.isolated`` gives a bare venv that still sees cloudpickle and this package (see
``_support``). The ``.pth`` is written after the install, so installers see only the venv
and install every requested package into it.

Versions: a layered venv resolves against the parent's installed versions
(``_constraints``): a package the kernel has keeps the kernel's version unless the request
pins it otherwise, so values cross between the kernel and the env. If the request cannot be
met with them, it is installed again without them, and the build log says why. An isolated
venv resolves on its own. The parent's versions are read when the venv is built (they do not
enter the URI: an upgrade in the kernel does not rebuild every env; ``Rebuild`` does).

The resource URI is a hash of the normal request, the Python it runs on and isolation — not
the installer: uv and pip give the same environment.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..context import ContextBuilder
from ..errors import BuildError
from ..spec.model import sha256_of
from . import _requirements as reqs
from ._interpreter import Interpreter, interpreter
from ._support import write_support
from ._uv import installer_env, uv_bin, uv_cache
from .base import BuildContext, RuntimeEnvPlugin

if TYPE_CHECKING:
    import asyncio

    from packaging.specifiers import SpecifierSet

    from ..spec import RuntimeEnvSpec

PARENT_PTH = "_jupyter_runtimeenv_parent.pth"
SUPPORT_PTH = "_jupyter_runtimeenv_support.pth"

__all__ = ["PipPlugin", "base_of", "venv_python", "venv_site_packages"]


def venv_python(venv: str | Path) -> str:
    return os.path.join(venv, "Scripts" if os.name == "nt" else "bin", "python")


def venv_site_packages(venv: str | Path, version: tuple[int, ...] | None = None) -> Path:
    """Where a venv of ``version`` (default: the agent's Python) keeps its packages."""
    if version is not None and version[:2] != sys.version_info[:2] and os.name != "nt":
        return Path(venv, "lib", f"python{version[0]}.{version[1]}", "site-packages")
    # The agent's own version: its scheme gives the layout.
    return Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))


def base_of(spec: RuntimeEnvSpec) -> Interpreter:
    """The interpreter a venv of ``spec`` is made from. Blocking (it may run it)."""
    return interpreter(spec.get("driver_python"))


class PipPlugin(RuntimeEnvPlugin):
    name = "pip"
    aliases = ("uv",)
    conflicts = ("conda",)
    # Early: it sets the interpreter; py_executable (40) overrides it if also given.
    priority = 10
    description = "packages to install in a venv: a list, a requirements file or a mapping"

    def validate(self, value: Any) -> dict[str, Any]:
        return reqs.normalize(value)

    def is_empty(self, value: Any) -> bool:
        return not value["packages"]  # Ray drops a pip field without packages

    def uris(self, value: Any, spec: RuntimeEnvSpec) -> list[str]:
        base = base_of(spec)
        key: dict[str, Any] = {
            "request": value,
            "python": [base.implementation, *base.version],
            "isolated": spec.config.isolated,
        }
        if not spec.config.isolated:
            # A layered venv depends on which environment it is layered over.
            key["parent"] = base.prefix
        return [f"pip:{sha256_of(key)[:32]}"]

    def describe(self, uri: str, value: Any, spec: RuntimeEnvSpec) -> str:
        packages = ", ".join(str(p) for p in value.get("packages", [])) or "(no packages)"
        if len(packages) > 70:
            packages = packages[:67] + "..."
        return f"{self.name}: {packages}"

    async def create(self, uri: str, value: Any, build: BuildContext) -> int:
        import asyncio  # loaded already: this runs on the agent's loop

        venv = build.target
        installer = build.spec.config.installer
        env = installer_env(build.cache_root)
        build.log(f"uv cache: {env['UV_CACHE_DIR']} ({uv_cache(build.cache_root)[1]})")
        python = venv_python(venv)
        base = await build.to_thread(base_of, build.spec)
        async with build.limit("install"):
            # Read in threads while uv works, not between its steps: the kernel's versions
            # (packaging's import and the parent's metadata, ~20 ms) while it makes the
            # venv, what this package requires of cloudpickle (importlib.metadata's import
            # and its metadata, ~15 ms) while it installs.
            pins = None
            if value["packages"] and not build.spec.config.isolated:
                pins = asyncio.ensure_future(build.to_thread(_kernel_pins, value, base))
            floor = None
            try:
                await build.run(
                    [
                        *(uv_bin(), "venv", str(venv), "--python", base.executable),
                        *("--relocatable", "--no-project", "--no-config"),
                    ],
                    env=env,
                    cwd=venv,
                    what="creating the venv (uv venv)",
                )
                floor = asyncio.ensure_future(build.to_thread(reqs.cloudpickle_floor))
                if value["packages"]:
                    pinned = None if pins is None else await pins
                    await self._install(value, venv, python, installer, env, build, base, pinned)
                if installer == "pip":
                    final = build.resource_path(uri)
                    await build.to_thread(_fix_scripts, venv, final)
                site_packages = venv_site_packages(venv, base.version)
                await build.to_thread(_check_support, site_packages, await floor)
            finally:
                for task in (pins, floor):
                    if task is not None and not task.done():
                        task.cancel()
                    if task is not None:
                        task.add_done_callback(_retrieved)
            if value["pip_check"]:
                check = (
                    [uv_bin(), "pip", "check", "--python", python]
                    if installer == "uv"
                    else [sys.executable, "-m", "pip", "--python", python, "check"]
                )
                await build.run(check, env=env, cwd=venv, what="pip check")
        await build.to_thread(_write_pth, venv, base, build.spec.config.isolated)
        return 0

    async def _install(
        self,
        value: dict[str, Any],
        venv: Path,
        python: str,
        installer: str,
        env: dict[str, str],
        build: BuildContext,
        base: Interpreter,
        pins: tuple[list[str], list[str]] | None,
    ) -> None:
        """``pins``: the kernel's versions to resolve against (``_kernel_pins``), None for
        an isolated venv."""
        requirements = venv / "requirements.txt"
        await build.to_thread(requirements.write_text, "\n".join(value["packages"]) + "\n")
        options = reqs.split_options(value["install_options"])
        constraints: list[str] = []
        pinned_names = [line.partition("==")[0] for line in pins[0]] if pins else []
        if pins is not None:
            pinned = await build.to_thread(_write_constraints, venv, base, pins, build)
            if pinned is not None:
                constraints = ["-c", str(pinned)]
        if installer == "uv":
            argv = [uv_bin(), "pip", "install", "--python", python, "-r", str(requirements)]
        else:
            argv = [sys.executable, "-m", "pip", "--python", python, "install"]
            argv += ["--no-input", "--progress-bar", "off", "-r", str(requirements)]
        wanted = reqs.names(value["packages"]) or value["packages"]
        build.log(f"installing {', '.join(value['packages'])} with {installer}")
        what = f"{installer} install"
        try:
            try:
                await build.run([*argv, *options, *constraints], env=env, cwd=venv, what=what)
            except BuildError as exc:
                if not constraints or not _blames(pinned_names, exc.output_tail):
                    raise
                build.log(
                    "the kernel's versions do not fit this request"
                    f" ({_failure_message(installer, wanted, exc.output_tail)});"
                    " installing again without them: packages the kernel also has may get"
                    " other versions here"
                )
                await build.run([*argv, *options], env=env, cwd=venv, what=what)
        except BuildError as exc:
            raise BuildError(
                _failure_message(installer, wanted, exc.output_tail),
                output_tail=exc.output_tail,
            ) from None

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        venv = ctx.resource_path(uris[0])
        ctx.python = venv_python(venv)
        ctx.env_vars["VIRTUAL_ENV"] = venv
        # A template (expanded where the worker starts): the agent's own PATH is not the
        # kernel's, nor the node's.
        path = ctx.env_vars.get("PATH") or "${PATH}"
        ctx.env_vars["PATH"] = os.pathsep.join([os.path.dirname(ctx.python), path])


# Where uv's and pip's own account of a failure starts ("error: No solution found ...",
# "ERROR: No matching distribution found for x", uv's fancy one on a terminal).
_ERROR_START = re.compile(r"^\s*(error:|ERROR:|\u00d7)")


def _reasons(tail: Sequence[str]) -> list[str]:
    """The installer's own account of a failure: its lines from the first error on."""
    starts = [i for i, line in enumerate(tail) if _ERROR_START.match(line)]
    return [line.strip() for line in tail[starts[0] :] if line.strip()] if starts else []


def _named(names: Sequence[str], text: str) -> list[str]:
    """The names ``text`` mentions as whole words (``alpha``, not ``alphabet``), however it
    spells their separators (``typing_extensions`` is ``typing-extensions``)."""
    found = []
    for name in names:
        spelled = r"[-_.]+".join(map(re.escape, re.split(r"[-_.]+", name)))
        if re.search(rf"(?<![\w.-]){spelled}(?![\w-])", text, re.I):
            found.append(name)
    return found


def _blames(pinned: Sequence[str], tail: Sequence[str]) -> bool:
    """Whether installing again without the kernel's versions could help: the installer's
    account names a package they pin, or gives none to read. A package that does not exist,
    or a request at odds with itself, fails the same way without them (and would show the
    same error twice)."""
    reasons = _reasons(tail)
    return not reasons or bool(_named(pinned, " ".join(reasons)))


def _failure_message(installer: str, wanted: list[str], tail: Sequence[str]) -> str:
    """Name the requirements the installer complained about, with its own words."""
    reasons = _reasons(tail)
    named = _named(wanted, " ".join(reasons))
    message = f"installing {', '.join(named or wanted)} failed ({installer})"
    if reasons:
        message += ": " + " ".join(reasons[:10])
    return message


def _kernel_pins(value: dict[str, Any], base: Interpreter) -> tuple[list[str], list[str]]:
    """The parent's versions to pin (see ``_constraints``) and the names the request pins
    otherwise. Blocking: run in a thread."""
    # Here, not with the module: parsing a pip spec needs none of packaging (cli.py).
    from ._constraints import installed_versions, pins_for

    return pins_for(installed_versions(base.site_dirs), value["packages"])


def _write_constraints(
    venv: Path, base: Interpreter, pins: tuple[list[str], list[str]], build: BuildContext
) -> Path | None:
    """Write the parent's versions as a constraints file; its path, or ``None`` when the
    parent has nothing to pin. Blocking: run in a thread."""
    lines, free = pins
    note = f"; the request pins {', '.join(free)} otherwise" if free else ""
    if not lines:
        if free:
            build.log(f"the kernel has no other package to pin{note}")
        return None
    path = venv / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    build.log(
        f"resolving against the kernel's versions of {len(lines)} installed packages"
        f" ({base.prefix}){note}"
    )
    return path


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Nothing awaits a read cut short by a failed install: its outcome is taken here."""
    if not future.cancelled():
        future.exception()


def _check_support(site_packages: Path, floor: SpecifierSet) -> None:
    """Refuse a venv whose own packages would shadow what workers need (``floor``: what
    this package requires of cloudpickle, ``reqs.cloudpickle_floor()``)."""
    if not site_packages.is_dir():
        return
    from packaging.version import InvalidVersion, Version

    for entry in site_packages.iterdir():
        name, _, rest = entry.name.partition("-")
        if not rest.endswith(".dist-info"):
            continue
        if name.lower().replace("_", "-") == reqs.SELF:
            raise BuildError(
                f"the requested packages install {reqs.SELF} into the environment, which"
                " would shadow the agent's own; remove what depends on it"
            )
        if name.lower() == reqs.CLOUDPICKLE:
            version = rest[: -len(".dist-info")]
            try:
                ok = Version(version) in floor
            except InvalidVersion:
                ok = False
            if not ok:
                raise BuildError(
                    f"the requested packages install cloudpickle {version}, but workers need"
                    f" cloudpickle{floor}; pin a compatible version"
                )


def _write_pth(venv: Path, base: Interpreter, isolated: bool) -> None:
    site_packages = venv_site_packages(venv, base.version)
    site_packages.mkdir(parents=True, exist_ok=True)
    if isolated:
        support = write_support(venv / "support")
        # A plain path line, appended after the venv's own site-packages (so a cloudpickle
        # the request installed wins), relative to site-packages: the venv moves after this.
        (site_packages / SUPPORT_PTH).write_text(f"{os.path.relpath(support, site_packages)}\n")
        return
    lines = [f"import site; site.addsitedir({d!r})" for d in base.site_dirs]
    (site_packages / PARENT_PTH).write_text("\n".join(lines) + "\n")


def _fix_scripts(venv: Path, final: Path) -> None:
    """pip writes the build directory into scripts' shebangs; point them at the final one."""
    bindir = Path(venv_python(venv)).parent
    old, new = f"#!{venv}".encode(), f"#!{final}".encode()
    for script in bindir.iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        with open(script, "rb") as f:
            head = f.read(len(old))
        if head == old:
            data = script.read_bytes()
            script.write_bytes(new + data[len(old) :])
