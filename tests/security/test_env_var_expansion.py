"""Threat: ``${VAR}`` in ``env_vars`` expanded in the agent's process (issue 16, item 5).

Over the server, a kernel's ``X=${ONLY_IN_KERNEL}`` gave its workers the *server's* value
(or ''), the expansion was baked into the shared cache, and over REST a spec could expand
the server's token (``JUPYTER_RUNTIMEENV_TOKEN``, which the extension exports for its
kernels) or any secret of the server's environment and read it back from ``GET envs/{id}``.

Rules under test (``context.process_env``): a context holds ``${NAME}`` templates; they are
expanded in the process that starts the worker, against its own environment, each time; the
agent never expands, and nothing it stores or serves holds a value of its environment.
Everything is real: a ``jupyter server`` subprocess with the extension, a kernel it started,
a worker of that kernel, the server's cache index on disk.
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_process import JupyterProcess

from jupyter_runtimeenv.context import EnvContext, process_env
from jupyter_runtimeenv.plugins.env_vars import EnvVarsPlugin

SECRET_VAR = "JRE_SERVER_ONLY_SECRET"
SPEC_VARS = {
    "A": "${ONLY_IN_KERNEL}",
    "S": "${" + SECRET_VAR + "}",
    "T": "${JUPYTER_RUNTIMEENV_TOKEN}",
    "P": "/opt/bin:${PATH}",
}


class Server(JupyterProcess):
    def __init__(self, root: Path, secret: str) -> None:
        self.runtime = root / "runtime"
        self.cache = root / "cache"
        env = {
            **os.environ,
            SECRET_VAR: secret,
            "JUPYTER_RUNTIME_DIR": str(self.runtime),
            "JUPYTER_DATA_DIR": str(root / "data"),
            "JUPYTER_CONFIG_DIR": str(root / "config"),
            "JUPYTER_RUNTIMEENV_CACHE": str(self.cache),
        }
        extensions = "{'jupyter_runtimeenv': True, 'jupyter_server_terminals': False}"
        super().__init__(
            "jupyter_server",
            root,
            root / "server.log",
            env=env,
            args=[f"--ServerApp.jpserver_extensions={extensions}"],
        )


@pytest.fixture
def secret() -> str:
    return "s3cret-" + secrets.token_hex(8)


@pytest.fixture
def server(tmp_path: Path, secret: str) -> Iterator[Server]:
    (tmp_path / "server").mkdir()
    running = Server(tmp_path / "server", secret)
    try:
        yield running
    finally:
        running.stop()


def connect(connection_file: Path) -> BlockingKernelClient:
    deadline = time.monotonic() + 60
    while True:
        kc = BlockingKernelClient(connection_file=str(connection_file))
        kc.load_connection_file()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
            return kc
        except RuntimeError:
            kc.stop_channels()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run(kc: BlockingKernelClient, code: str) -> str:
    out: list[str] = []

    def hook(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream":
            out.append(message["content"]["text"])
        elif message["msg_type"] == "error":
            out.append("\n".join(message["content"]["traceback"]))

    reply = kc.execute_interactive(code, output_hook=hook, timeout=180)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)


KERNEL_CODE = textwrap.dedent(
    """
    import json, os
    import jupyter_runtimeenv as jre
    from jupyter_runtimeenv.client import get_client

    get_client()  # the server's agent, found through what the server exported to us
    os.environ["ONLY_IN_KERNEL"] = "kernel-value"
    os.environ["PATH"] = "/kernel/bin"
    for name in ({secret_var!r}, "JUPYTER_RUNTIMEENV_TOKEN"):
        os.environ.pop(name, None)

    @jre.remote(runtime_env={{"env_vars": {spec_vars!r}}})
    def read():
        import os
        return {{key: os.environ.get(key) for key in "ASTP"}}

    print(json.dumps(jre.get(read.remote(), timeout=120)))
    """
)


def test_variables_expand_in_the_kernel_never_in_the_server(server: Server, secret: str) -> None:
    kernel = server.request("POST", "api/kernels", {"name": "python3"})
    try:
        kc = connect(server.runtime / f"kernel-{kernel['id']}.json")
        try:
            code = KERNEL_CODE.format(secret_var=SECRET_VAR, spec_vars=SPEC_VARS)
            seen = json.loads(run(kc, code).strip().splitlines()[-1])
        finally:
            kc.stop_channels()
    finally:
        server.request("DELETE", f"api/kernels/{kernel['id']}")
    # The kernel's own values; neither the server's secret nor its token.
    assert seen == {"A": "kernel-value", "S": "", "T": "", "P": "/opt/bin:/kernel/bin"}

    envs = server.api("GET", "envs")["envs"]
    assert envs
    for summary in envs:
        env = server.api("GET", f"envs/{summary['env_id']}")
        text = json.dumps(env)
        assert secret not in text
        assert server.token not in text
        if env["context"] and "A" in env["context"]["env_vars"]:
            assert {k: env["context"]["env_vars"][k] for k in SPEC_VARS} == SPEC_VARS
    index = b"".join(p.read_bytes() for p in server.cache.glob("index.sqlite*"))
    assert secret.encode() not in index
    assert server.token.encode() not in index


def test_a_rest_spec_cannot_read_the_servers_environment(server: Server, secret: str) -> None:
    spec = {"env_vars": {"T": "${JUPYTER_RUNTIMEENV_TOKEN}", "S": "${" + SECRET_VAR + "}"}}
    created = server.api("POST", "envs?wait=true", spec)
    assert created["state"] == "READY", created
    env = server.api("GET", f"envs/{created['env_id']}")
    assert env["context"]["env_vars"] == spec["env_vars"]
    for answer in (created, env, server.api("GET", "envs")):
        text = json.dumps(answer)
        assert secret not in text
        assert server.token not in text


def test_templates_compose_with_the_plugins_before_them() -> None:
    """``${NAME}`` of a variable the env set earlier (the pip plugin's ``PATH``) means that
    variable's template; the rest stays a reference to the starting process's environment."""
    from jupyter_runtimeenv.context import ContextBuilder

    builder = ContextBuilder(env_vars={"PATH": "/venv/bin:${PATH}"})
    plugin = EnvVarsPlugin()
    value = plugin.validate({"PATH": "/opt/bin:${PATH}", "B": "${HOME}-${PATH}", "C": "${NOPE}x"})
    plugin.modify_context([], value, builder)  # in the spec's (sorted) order
    ctx: EnvContext = builder.freeze()
    assert dict(ctx.env_vars) == {
        "B": "${HOME}-/venv/bin:${PATH}",
        "C": "${NOPE}x",
        "PATH": "/opt/bin:/venv/bin:${PATH}",
    }
    env = process_env(ctx, base={"PATH": "/usr/bin", "HOME": "/home/u"})
    assert env["PATH"] == "/opt/bin:/venv/bin:/usr/bin"
    assert env["B"] == "/home/u-/venv/bin:/usr/bin"
    assert env["C"] == "x"  # unset: '' (as in Ray)
    # No PATH at all: the default search path, never an empty entry (the current directory).
    assert process_env(ctx, base={})["PATH"] == f"/opt/bin:/venv/bin:{os.defpath}"


async def test_a_context_stored_expanded_is_neither_used_nor_served(
    make_agent: Any, cache_dir: Path
) -> None:
    """Caches written before stored contexts with the agent's values expanded: such an env
    is rebuilt at its next use (its resources reused), and served without its context."""
    import sqlite3

    from jupyter_runtimeenv.agent import RuntimeEnvAgent

    agent: RuntimeEnvAgent = await make_agent()
    spec = {"env_vars": {"S": "${" + SECRET_VAR + "}"}}
    ctx = await agent.get_or_create(spec, "test")
    env_id = ctx.env_id
    await agent.stop()
    old = {**ctx.to_json(), "env_vars": {"S": "leaked-value"}}
    del old["format"]
    with sqlite3.connect(cache_dir / "index.sqlite") as db:
        db.execute("UPDATE envs SET context = ? WHERE env_id = ?", (json.dumps(old), env_id))
    db.close()

    again: RuntimeEnvAgent = await make_agent()
    served = await again.env_status(env_id)
    assert "leaked-value" not in json.dumps(served)
    rebuilt = await again.get_or_create(spec, "test")
    assert dict(rebuilt.env_vars) == spec["env_vars"]
    assert "leaked-value" not in json.dumps(await again.env_status(env_id))
