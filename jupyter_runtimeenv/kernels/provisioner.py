"""``RuntimeEnvProvisioner``: a kernel that starts inside a runtime environment.

A kernelspec names it (``metadata.kernel_provisioner.provisioner_name`` is
``runtime-env-provisioner``) and holds the spec in its config (``runtime_env``). Before the
kernel starts, the provisioner gets the environment built: through the agent of the server
extension when it runs in a Jupyter server with the extension (same process, same loop), else
through ``get_client()`` (the server's REST API or an embedded agent). Then it starts the
kernel's argv with the env's interpreter, command prefix, variables and cwd. The env's
``sys.path`` entries are put first by a standard-library bootstrap passed with ``-c`` (the
same thing a worker's bootstrap does), not by ``PYTHONPATH``, so that the kernel's own
subprocesses do not inherit them as a side effect.

The kernel's reference is held as ``kernel:<kernel id>`` and released when the provisioner is
cleaned up (shutdown, or death noticed by the kernel manager); the server extension also
releases every ``kernel:<id>`` reference when the kernel shuts down or vanishes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Dict

from ..client import get_client
from ..context import SYS_PATH_VAR, EnvContext, compose, process_env
from ..errors import RuntimeEnvError
from ..server.app import local_agent
from ..server.client import KERNEL_ID_VAR
from ..server.holders import kernel_holder
from ..spec import TRUSTED
from .command import kernel_command

PROVISIONER_NAME = "runtime-env-provisioner"

_CHECK_IPYKERNEL = (
    "import json, os, sys;"
    f"sys.path[0:0] = json.loads(os.environ.get({SYS_PATH_VAR!r}) or '[]');"
    "import ipykernel"
)


class RuntimeEnvProvisioner(LocalProvisioner):
    """Starts a local kernel inside the runtime environment in its ``runtime_env`` config."""

    runtime_env = Dict(
        config=True, help="The runtime env spec the kernel starts in (Ray-compatible fields)."
    )

    context: EnvContext | None = None

    @property
    def holder(self) -> str:
        return kernel_holder(self.kernel_id)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Build the env, then rewrite the launch command and environment. Called by
        ``KernelManager.pre_start_kernel`` on every start and restart."""
        ctx = await self._acquire()
        kwargs = await super().pre_launch(**kwargs)
        env = process_env(ctx, base=kwargs.get("env"))
        env[KERNEL_ID_VAR] = self.kernel_id
        await _ensure_ipykernel(ctx, env)
        kwargs["cmd"] = kernel_command(ctx, kwargs["cmd"])
        kwargs["env"] = env
        if ctx.cwd:
            kwargs["cwd"] = ctx.cwd
        return kwargs

    async def cleanup(self, restart: bool = False) -> None:
        """Release the kernel's reference unless it restarts. Called by the kernel manager
        after the kernel process is gone."""
        await super().cleanup(restart=restart)
        if restart or self.context is None:
            return
        env_id, self.context = self.context.env_id, None
        try:
            agent = await local_agent()
            if agent is not None:
                await agent.release(env_id, self.holder)
            else:
                await get_client().release(env_id, self.holder)
        except Exception as exc:  # a gone agent must not break the kernel's shutdown
            self.log.warning("jupyter_runtimeenv: releasing %s failed: %s", env_id[:12], exc)

    async def _acquire(self) -> EnvContext:
        if self.context is not None:
            return self.context  # a restart: same env, reference already held
        spec = spec_for_kernel(self.runtime_env, list(self.kernel_spec.argv))
        agent = await local_agent()
        if agent is not None:
            # The kernelspec is a file on the server's disk, as trusted as its argv (which
            # the server runs anyway): not a request, so not the REST policy.
            parsed = await asyncio.to_thread(agent.parse, spec, policy=TRUSTED)
            self.context = await agent.get_or_create(parsed, self.holder)
        else:
            self.context = await get_client().acquire(spec, self.holder)
        return self.context


def spec_for_kernel(runtime_env: Mapping[str, Any], argv: list[str]) -> dict[str, Any]:
    """The kernelspec's runtime env, built on the kernelspec's own interpreter when its argv
    names one by absolute path: the kernel is the driver, so its ``pip`` env layers over the
    kernel's environment rather than the server's (``driver_python``)."""
    spec = dict(runtime_env)
    python = argv[0] if argv else ""
    if (
        "driver_python" not in spec
        and "conda" not in spec
        and os.path.isabs(python)
        and os.access(python, os.X_OK)
    ):
        spec["driver_python"] = python
    return spec


async def _ensure_ipykernel(ctx: EnvContext, env: dict[str, str]) -> None:
    """Fail early and clearly when the env's interpreter cannot import ipykernel.

    Envs layered over the server's (the default) see its ipykernel. An isolated env gets it
    from ``with_ipykernel`` in ``kernelspec.install_kernelspec``; anything else is refused here
    with the remedy rather than as a kernel that dies at start.
    """
    proc = await asyncio.create_subprocess_exec(
        *compose(ctx, ["-c", _CHECK_IPYKERNEL]),
        env=env,
        cwd=ctx.cwd,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise RuntimeEnvError(
            f"ipykernel cannot be imported by {ctx.python} in environment {ctx.env_id[:12]}"
            f" ({tail[0]}); add 'ipykernel' to the spec's packages"
        )
