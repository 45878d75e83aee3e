"""``%driver_sys_path``: the entries workers get first on their ``sys.path``.

Who calls it: IPython, after ``%load_ext jupyter_runtimeenv`` registered
``DriverSysPathMagics``. It reads and changes the ``driver_sys_path`` field of the
default env in the session (``session``) and, while that is ``true``, the kernel's own
``sys.path``, which ``workers.executor.resolve_driver_sys_path`` resolves at each submit.
"""

from __future__ import annotations

import os
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from .. import api
from ..errors import SpecError
from ..spec import merge
from ._magic_args import argument, magic_arguments, parse_argstring

__all__ = ["DriverSysPathMagics"]


@magics_class
class DriverSysPathMagics(Magics):
    """The ``%driver_sys_path`` line magic; one per IPython shell."""

    @magic_arguments()
    @argument("--add", metavar="PATH", help="put PATH first on the kernel's sys.path")
    @argument("--remove", metavar="PATH", help="take PATH off")
    @argument("--off", action="store_true", help="workers do not get the kernel's sys.path")
    @argument("--on", action="store_true", help="workers get the kernel's sys.path (default)")
    @line_magic
    def driver_sys_path(self, line: str) -> None:
        """Show the entries workers get first on their ``sys.path``, in order; change them.

        With the default (``driver_sys_path: true``) these are the kernel's own ``sys.path``
        entries (minus its interpreter's stdlib and site-packages): ``--add``/``--remove``
        change the kernel's ``sys.path``. With an explicit list in the default env they
        change that list. ``--off``/``--on`` set ``driver_sys_path`` of the default env.
        """
        try:
            args = parse_argstring(DriverSysPathMagics.driver_sys_path, line, "driver_sys_path")
        except SystemExit:
            return
        if args.on and args.off:
            raise UsageError("driver_sys_path: --on and --off together")
        if args.on or args.off:
            api.init(runtime_env=merge(api.default_runtime_env(), {"driver_sys_path": args.on}))
        if args.add or args.remove:
            self._change_paths(args.add, args.remove)
        print(_describe_driver_sys_path())

    def _change_paths(self, add: str | None, remove: str | None) -> None:
        spec = api.default_runtime_env()
        setting = True if spec is None else spec.driver_sys_path
        if setting is True:
            if remove is not None:
                target = os.path.abspath(remove)
                hits = [e for e in sys.path if e and os.path.abspath(e) == target]
                if not hits:
                    raise UsageError(f"driver_sys_path: {remove} is not on the kernel's sys.path")
                for entry in hits:
                    sys.path.remove(entry)
            if add is not None:
                sys.path.insert(0, os.path.abspath(add))
            return
        entries = [] if setting is False else list(setting)
        if remove is not None:
            target = os.path.abspath(remove)
            if target not in entries:
                raise UsageError(f"driver_sys_path: {remove} is not in the list")
            entries.remove(target)
        if add is not None:
            entries.insert(0, os.path.abspath(add))
        try:
            api.init(runtime_env=merge(spec, {"driver_sys_path": entries}))
        except SpecError as exc:
            raise UsageError(f"driver_sys_path: {_first_line(exc)}") from None


def _describe_driver_sys_path() -> str:
    from ..workers.executor import resolve_driver_sys_path

    spec = api.default_runtime_env()
    setting = True if spec is None else spec.driver_sys_path
    if setting is False:
        return "driver_sys_path: off (workers get only their environment's sys.path)"
    if setting is True:
        entries = list(resolve_driver_sys_path())
        head = f"driver_sys_path: the kernel's sys.path, {len(entries)} entries first on workers'"
    else:
        entries = list(setting)
        head = f"driver_sys_path: a list of {len(entries)} entries first on workers'"
    return "\n".join([head, *(f"  {i}. {e}" for i, e in enumerate(entries, 1))])


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
