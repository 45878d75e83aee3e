"""IPython integration: ``%runtime_env``, ``%%remote`` and ``%driver_sys_path``, loaded with
``%load_ext jupyter_runtimeenv``.

Who calls it: IPython, through ``jupyter_runtimeenv.load_ipython_extension`` (the
``%load_ext`` hook of the top-level package), which delegates here. Loading registers the
magics and puts ``remote``, ``get`` and ``wait`` into the user namespace, so a notebook can
write a bare ``@remote``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_ipython_extension", "unload_ipython_extension"]

#: The names ``%load_ext`` puts into the user namespace.
USER_NAMES = ("remote", "get", "wait")


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics on ``ipython`` and push the remote API into its namespace."""
    from .. import api
    from .magics import RuntimeEnvMagics
    from .remote_cell import RemoteCellMagics
    from .sys_path import DriverSysPathMagics

    ipython.register_magics(RuntimeEnvMagics(ipython))
    ipython.register_magics(RemoteCellMagics(ipython))
    ipython.register_magics(DriverSysPathMagics(ipython))
    ipython.push({name: getattr(api, name) for name in USER_NAMES})


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext jupyter_runtimeenv``: release the magic's environment references.

    The magic itself stays registered (IPython has no way to unregister a magics class);
    the names pushed into the user namespace are removed.
    """
    from .. import api
    from .magics import RuntimeEnvMagics

    magics = ipython.magics_manager.registry.get(RuntimeEnvMagics.__name__)
    if isinstance(magics, RuntimeEnvMagics):
        magics.release(every=True)
    ipython.drop_by_id({name: getattr(api, name) for name in USER_NAMES})
