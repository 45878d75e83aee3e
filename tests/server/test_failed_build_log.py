"""A failed ``%runtime_env`` build of the server's agent offers its whole log one click away
(issue 21 item 6): above the one-line error, a "View log" link the JupyterLab extension
opens in a tab (``runtimeenv:view-log``), whose text form names the log's path. In a real
kernel of a real server, with a plugin whose build fails."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest

from tests.kernels.test_kernels import start_kernel
from tests.server.plugins import script

ROOT = Path(__file__).resolve().parents[2]


async def outputs(jp_serverapp: Any, kernel_id: str, code: str) -> list[dict[str, Any]]:
    """The iopub messages (type and content) of running ``code`` in the kernel."""
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    seen: list[dict[str, Any]] = []
    try:
        await client.wait_for_ready(timeout=60)
        await client.execute_interactive(
            code,
            output_hook=lambda m: seen.append({"type": m["msg_type"], **m["content"]}),
            timeout=120,
        )
    finally:
        client.stop_channels()
    return seen


async def test_a_failed_build_offers_view_log(
    jp_fetch: Any, jp_serverapp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kernel parses the spec: it imports the tests' plugin too.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    kernel_id = await start_kernel(jp_fetch, "python3")
    await outputs(jp_serverapp, kernel_id, "%load_ext jupyter_runtimeenv")
    spec = json.dumps(script("broken", lines=3, fail=True))
    seen = await outputs(jp_serverapp, kernel_id, f"%%runtime_env --no-widget\n{spec}")
    shown = [m["data"] for m in seen if m["type"] == "display_data"]
    assert len(shown) == 1, seen
    (data,) = shown
    link = data["text/html"]
    assert 'data-commandlinker-command="runtimeenv:view-log"' in link
    args = link.split('data-commandlinker-args="', 1)[1].split('"', 1)[0]
    env_id = json.loads(html.unescape(args))["env_id"]
    assert len(env_id) == 64
    assert data["text/plain"].startswith(f"the build of {env_id[:12]} failed at ")
    log_path = data["text/plain"].split("; the whole log: ", 1)[1]
    assert "script line 2" in Path(log_path).read_text()
    # The error still follows, with what the notebook keeps.
    errors = "".join(m.get("text", "") for m in seen if m.get("name") == "stderr")
    assert "UsageError: runtime_env: build failed" in errors
    assert "this notebook keeps the environment it had" in errors
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
