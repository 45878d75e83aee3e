"""Which plugin steps the agent runs on its loop: a ``pure_context`` plugin's
``modify_context`` (it only computes), and never a plain one's (it may block)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from jupyter_runtimeenv.context import ContextBuilder
from jupyter_runtimeenv.plugins import PluginRegistry, RuntimeEnvPlugin
from jupyter_runtimeenv.plugins.driver_python import DriverPythonPlugin
from jupyter_runtimeenv.plugins.driver_sys_path import DriverSysPathPlugin
from jupyter_runtimeenv.plugins.env_vars import EnvVarsPlugin
from jupyter_runtimeenv.plugins.working_dir import WorkingDirPlugin

MakeAgent = Callable[..., Any]


class _Recording(RuntimeEnvPlugin):
    """Sets ``<NAME>=1`` and records the thread its ``modify_context`` ran in."""

    threads: ClassVar[dict[str, int]] = {}

    def modify_context(self, uris: Sequence[str], value: Any, ctx: ContextBuilder) -> None:
        self.threads[self.name] = threading.get_ident()
        ctx.env_vars[self.name.upper()] = "1"


class PurePlugin(_Recording):
    name = "pure"
    pure_context = True


class PlainPlugin(_Recording):
    name = "plain"


async def test_a_pure_context_runs_on_the_loop_a_plain_one_in_a_thread(
    make_agent: MakeAgent,
) -> None:
    agent = await make_agent(registry=PluginRegistry([PurePlugin(), PlainPlugin()]))
    ctx = await agent.get_or_create(agent.parse({"pure": 1, "plain": 1}), "h")
    assert (ctx.env_vars["PURE"], ctx.env_vars["PLAIN"]) == ("1", "1")
    loop_thread = threading.get_ident()  # the test runs on the agent's loop
    assert _Recording.threads["pure"] == loop_thread
    assert _Recording.threads["plain"] != loop_thread


def test_the_built_in_plugins_that_only_compute_say_so() -> None:
    for plugin in (EnvVarsPlugin, DriverPythonPlugin, DriverSysPathPlugin, WorkingDirPlugin):
        assert plugin.pure_context, plugin.name
    assert not RuntimeEnvPlugin.pure_context  # an out-of-tree plugin may block: a thread
