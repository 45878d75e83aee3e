"""Finished widgets stay readable without their kernel (issue 21 item 1).

In a real kernel through jupyter_client: when a build (foreground or ``--background``) or a
``progress()`` bar ends, its output is replaced by ``update_display_data`` carrying
``text/html`` and ``text/plain`` drawn from the final state (no widget model reference, which a
saved notebook cannot show once the kernel is gone), and metadata naming the widget model it
replaces (the JupyterLab extension swaps outputs by it when the cell is over).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_process import execute, of_type, running_kernel

from jupyter_runtimeenv.ipython.static import METADATA_KEY, WIDGET_MIME

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[BlockingKernelClient]:
    with running_kernel(tmp_path, {"JUPYTER_RUNTIMEENV_CACHE": str(tmp_path / "cache")}) as (
        _,
        kc,
    ):
        reply, _ = execute(kc, "%load_ext jupyter_runtimeenv")
        assert reply["status"] == "ok"
        yield kc


def _shown_and_final(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The widget's display_data and the last update of the same display id."""
    [shown] = [m for m in of_type(messages, "display_data") if WIDGET_MIME in m["content"]["data"]]
    display_id = shown["content"]["transient"]["display_id"]
    updates = [
        m
        for m in of_type(messages, "update_display_data")
        if m["content"]["transient"]["display_id"] == display_id
    ]
    assert updates, "the finished widget was never replaced"
    return shown, updates[-1]


def _check_static(shown: dict[str, Any], final: dict[str, Any]) -> tuple[str, str]:
    data = final["content"]["data"]
    assert WIDGET_MIME not in data  # nothing that needs the kernel's model
    model_id = shown["content"]["data"][WIDGET_MIME]["model_id"]
    assert final["content"]["metadata"][METADATA_KEY] == {"replaces": [model_id]}
    return data["text/html"], data["text/plain"]


def test_a_finished_build_is_replaced_by_its_static_html_and_text(
    client: BlockingKernelClient, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.csv").write_text("a,b\n")
    reply, messages = execute(client, "%runtime_env --working-dir data")
    assert reply["status"] == "ok", reply
    html, text = _check_static(*_shown_and_final(messages))
    # The header's outcome and the step by its label, with its status.
    assert "READY" in html
    assert "working_dir: data/ (1 file" in html
    assert "done" in html
    assert "READY" in text
    assert "working_dir: data/ (1 file" in text


def test_a_failed_build_keeps_its_step_and_installer_output(
    client: BlockingKernelClient, tmp_path: Path
) -> None:
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    reply, messages = execute(
        client, f"%runtime_env --pip nosuchpkg-xyz==1.0 --no-index --find-links {empty}"
    )
    assert reply["status"] == "error"
    html, text = _check_static(*_shown_and_final(messages))
    assert "FAILED" in html
    assert "nosuchpkg-xyz" in html
    assert "FAILED" in text
    assert "nosuchpkg-xyz" in text


def test_a_background_build_is_replaced_after_its_cell_ended(
    client: BlockingKernelClient, tmp_path: Path
) -> None:
    # A step that takes a moment, so that the build ends after the cell did.
    slow = tmp_path / "slow"
    slow.mkdir()
    for i in range(200):
        (slow / f"f{i}.txt").write_text("x" * 10_000)
    reply, messages = execute(client, "%runtime_env --background --working-dir slow")
    assert reply["status"] == "ok"
    [shown] = [m for m in of_type(messages, "display_data") if WIDGET_MIME in m["content"]["data"]]
    display_id = shown["content"]["transient"]["display_id"]
    finals = [
        m
        for m in of_type(messages, "update_display_data")
        if m["content"]["transient"]["display_id"] == display_id
        and WIDGET_MIME not in m["content"]["data"]
    ]
    final = finals[-1] if finals else None  # the build may end before its cell does
    deadline = time.monotonic() + 120
    while final is None:
        assert time.monotonic() < deadline, "no final update after the background build"
        try:
            message = client.get_iopub_msg(timeout=1)
        except Exception:  # queue.Empty: keep waiting
            continue
        content = message["content"]
        if (
            message["msg_type"] == "update_display_data"
            and content["transient"]["display_id"] == display_id
            and WIDGET_MIME not in content["data"]
        ):
            final = message
    html, text = _check_static(shown, final)
    assert "READY" in html
    assert "READY" in text


def test_a_finished_progress_bar_is_static(client: BlockingKernelClient) -> None:
    code = (
        "from jupyter_runtimeenv import progress\n"
        "@remote\n"
        "def square(x):\n"
        "    return x * x\n"
        "print(get(progress([square.remote(i) for i in range(3)])))"
    )
    reply, messages = execute(client, code)
    assert reply["status"] == "ok", reply
    html, text = _check_static(*_shown_and_final(messages))
    assert "3/3 finished" in html
    assert "3 done" in html
    assert text.startswith("tasks: 3/3 finished")


def test_the_kernel_answers_a_frontends_question_for_finished_widgets(
    client: BlockingKernelClient, tmp_path: Path
) -> None:
    """What the JupyterLab extension asks when it connects to a notebook's kernel (the
    expression ``finalsExpression`` in outputs.ts builds): the static forms by model id."""
    reply, messages = execute(client, "%runtime_env --env-var MODE=asked")
    assert reply["status"] == "ok"
    shown, final = _shown_and_final(messages)
    model_id = shown["content"]["data"][WIDGET_MIME]["model_id"]
    module = "__import__('sys').modules.get('jupyter_runtimeenv.ipython.static')"
    expression = f"getattr({module}, 'final_bundles', lambda ids: None)([{model_id!r}, 'nope'])"
    msg_id = client.execute("", silent=True, user_expressions={"finals": expression})
    answer = client.get_shell_msg(timeout=60)
    assert answer["parent_header"]["msg_id"] == msg_id
    result = answer["content"]["user_expressions"]["finals"]
    assert result["status"] == "ok", result
    found = result["data"]["application/json"]
    assert list(found) == [model_id]
    assert found[model_id]["data"] == final["content"]["data"]


def test_a_cluster_builds_static_form_has_a_row_per_node() -> None:
    """The per-node widget of a Dask build (``cluster_build.py``) turns static the same way:
    the rows are drawn from its widget tree. No kernel: the widgets' values are what a
    frontend would be sent."""
    from jupyter_runtimeenv.ipython.cluster_build import ClusterBuildWidget, NodeRows
    from jupyter_runtimeenv.ipython.static import final_bundles, finalize
    from jupyter_runtimeenv.workers.cluster import NodeBuild

    class Handle:  # what IPython's display(..., display_id=True) returns, recording updates
        def __init__(self) -> None:
            self.updates: list[tuple[Any, dict[str, Any]]] = []

        def update(self, obj: Any, **kwargs: Any) -> None:
            self.updates.append((obj, kwargs))

    widget = ClusterBuildWidget()
    rows = NodeRows()
    ok = NodeBuild("tcp://127.0.0.1:4001", state="READY", env_id="ab" * 32, seconds=1.0)
    bad = NodeBuild("tcp://127.0.0.1:4002", state="FAILED", env_id="ab" * 32, step="pip: six")
    bad.error = {"message": "no matching distribution for six", "step": "pip: six"}
    bad.lines.append("uv: six was not found")
    rows.nodes("ab" * 32, [ok, bad])
    widget.finish(rows, None)
    handle = Handle()
    try:
        static = finalize(handle, widget.box, widget.text())
        for html in (static.html, static.text):
            assert "tcp://127.0.0.1:4001" in html
            assert "tcp://127.0.0.1:4002" in html
            assert "FAILED" in html
        assert "uv: six was not found" in static.html
        [(sent, kwargs)] = handle.updates
        assert sent is static
        [model_id] = kwargs["metadata"][METADATA_KEY]["replaces"]
        assert final_bundles([model_id]).found[model_id]["data"]["text/html"] == static.html
    finally:
        widget.close()


def test_a_cluster_build_in_a_kernel_ends_static_with_its_node(
    client: BlockingKernelClient, tmp_path: Path
) -> None:
    """``%runtime_env`` on a Dask session executor (a real ``LocalCluster`` started in the
    kernel, one worker process on 127.0.0.1) shows a row per node, then its static form."""
    setup = (
        "import distributed, jupyter_runtimeenv as jre\n"
        "from jupyter_runtimeenv.dask import DaskExecutor\n"
        "cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,"
        " host='127.0.0.1', dashboard_address=None)\n"
        "dask_client = distributed.Client(cluster, set_as_default=False)\n"
        f"jre.init(executor=DaskExecutor(dask_client, node_cache_dir={str(tmp_path / 'node')!r}))\n"
        "address = list(dask_client.scheduler_info()['workers'])[0]\n"
        "print(address)"
    )
    reply, messages = execute(client, setup, timeout=180)
    assert reply["status"] == "ok", reply
    address = "".join(m["content"]["text"] for m in of_type(messages, "stream")).split()[-1]
    try:
        reply, messages = execute(client, "%runtime_env --env-var ON=cluster", timeout=180)
        assert reply["status"] == "ok", reply
        html, text = _check_static(*_shown_and_final(messages))
        assert address in html
        assert "READY on 1/1 nodes" in html
        assert address in text
    finally:
        execute(client, "jre.shutdown(); dask_client.close(); cluster.close()", timeout=120)
