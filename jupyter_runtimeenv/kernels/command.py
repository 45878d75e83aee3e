"""A kernelspec's argv started inside an environment: the interpreter swapped for the env's,
its command prefix in front, and its ``sys.path`` entries put first by a bootstrap.

Who calls it: both provisioners (``provisioner.py`` for kernels on this machine, the node
agent's ``dask/node_kernels.py`` for kernels on a Dask node). Standard library and
``context`` only, so the node side can use it without the server's modules.
"""

from __future__ import annotations

import os
import sys

from ..context import SYS_PATH_VAR, EnvContext, compose
from ..errors import RuntimeEnvError

#: Names the env's trees whose files are links to the content store (``plugins/_sources``).
TREES_VAR = "JUPYTER_RUNTIMEENV_TREES"
#: The copy-on-write guard of those files (``workers/_cow.py``), loaded by path: the kernel's
#: interpreter may not have this package.
_COW = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "_cow.py"
)
#: Puts the env's sys.path entries first, installs the guard when the env has trees (what the
#: kernel writes in its working_dir, its env's own copy, reaches no other env), then runs the
#: module as ``python -m`` would. The entries go in through ``-c``, not ``PYTHONPATH``, so
#: that the kernel's own subprocesses do not inherit them as a side effect.
BOOTSTRAP = "\n".join(
    [
        "import json, os, runpy, sys",
        f"sys.path[0:0] = [p for p in json.loads(os.environ.get({SYS_PATH_VAR!r}) or '[]')"
        " if p not in sys.path]",
        f"if os.environ.get({TREES_VAR!r}):",
        "    import importlib.util",
        f"    _s = importlib.util.spec_from_file_location('_jupyter_runtimeenv_cow', {_COW!r})",
        "    _m = importlib.util.module_from_spec(_s)",
        "    _s.loader.exec_module(_m)",
        "    _m.install_from_env()",
        "m = sys.argv[1]; sys.argv = [m] + sys.argv[2:]",
        "runpy.run_module(m, run_name='__main__', alter_sys=True)",
    ]
)


def kernel_command(ctx: EnvContext, cmd: list[str]) -> list[str]:
    """The kernelspec's argv started in ``ctx``.

    ``argv[0]`` must be a Python interpreter (``python``, ``python3``, ``{sys.executable}``):
    it is replaced by the env's. ``python -m module ...`` goes through the sys.path bootstrap
    when the env has sys.path entries.
    """
    if not cmd or not is_python(cmd[0]):
        raise RuntimeEnvError(
            f"the kernelspec's argv must start with a Python interpreter, got {cmd[:1]!r}"
        )
    args = list(cmd[1:])
    if ctx.sys_path and len(args) >= 2 and args[0] == "-m":
        args = ["-c", BOOTSTRAP, *args[1:]]
    return compose(ctx, args)


def is_python(arg: str) -> bool:
    """Whether a kernelspec's ``argv[0]`` names a Python interpreter."""
    name = os.path.basename(arg).lower()
    return arg == sys.executable or name.startswith("python") or name == "{python}"
