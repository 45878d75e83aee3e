"""``BuildStatusWidget`` fed by the events of real builds of a real embedded agent.

No frontend: ipywidgets opens each widget's comm through ``comm.create_comm``, which outside
a running kernel gives a comm that sends nothing (ipykernel's ``Comm`` publishes only when a
kernel is initialized; the ``comm`` package's default is a ``DummyComm``). No mock is needed;
the widgets' trait values are what a frontend would be sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from wheelhouse import offline_installers

from jupyter_runtimeenv import api
from jupyter_runtimeenv.client import EmbeddedClient
from jupyter_runtimeenv.errors import BuildError
from jupyter_runtimeenv.ipython.magics import RuntimeEnvMagics
from jupyter_runtimeenv.ipython.progress import build_now
from jupyter_runtimeenv.ipython.widget import BuildStatusWidget, widgets_available
from jupyter_runtimeenv.spec import parse


@pytest.fixture
def widgets() -> Iterator[list[BuildStatusWidget]]:
    made: list[BuildStatusWidget] = []
    yield made
    for widget in made:
        widget.close()


def _pip_spec(wheelhouse: Path, *packages: str) -> Any:
    return parse(
        {
            "pip": {
                "packages": list(packages),
                "install_options": ["--no-index", "--find-links", str(wheelhouse)],
            },
            "env_vars": {"MODE": "fast"},
        }
    )


class _NoOutput:
    def write(self, text: str) -> int:
        raise AssertionError(f"the widget path printed {text!r}")

    def flush(self) -> None:
        pass


def test_a_real_build_ends_ready_with_steps_and_installer_lines(
    agent: EmbeddedClient,
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
    widgets: list[BuildStatusWidget],
) -> None:
    offline_installers(monkeypatch, wheelhouse)
    spec = _pip_spec(wheelhouse, "alpha==1.0")
    widget = BuildStatusWidget(spec.env_id)
    widgets.append(widget)

    summary = build_now(spec, agent, "test-widget", _NoOutput(), widget)  # type: ignore[arg-type]

    assert widget.state == "READY"
    assert widget.built
    assert f"runtime env <code>{spec.env_id[:12]}</code>" in widget.header.value
    assert "READY" in widget.header.value
    names = list(widget.steps)
    assert any(name.startswith("pip pip:") for name in names)
    for name in names:
        assert widget.steps[name]["status"] in ("done", "cached")
    # Steps are shown by what they install, not by their URI's hash.
    assert [s["label"] for s in widget.steps.values()] == ["pip: alpha==1.0"]
    assert "<code>pip: alpha==1.0</code>" in widget.table.value
    assert "&#10003;" in widget.table.value  # a text check mark, no emoji
    for emoji in ("&#9203;", "\u23f3", "&#10004;", "&#10008;"):
        assert emoji not in widget.table.value + widget.header.value
    assert "installing alpha==1.0 with uv" in widget.log_text
    assert "installing alpha==1.0 with uv" in widget.output.value
    assert "flex-direction:column-reverse" in widget.output.value  # pinned to its end
    assert "flex:none" in widget.output.value  # ... in JupyterLab too (its pre scrolls)
    assert widget.output.layout.display is None  # shown: it has lines
    assert widget.error is None

    text = widget.text()
    assert text.startswith(f"building runtime env {spec.env_id[:12]}")
    assert "installing alpha==1.0 with uv" in text
    assert text.splitlines()[-1].startswith(f"runtime env {spec.env_id[:12]} — READY (")
    bundle = widget._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.box.model_id
    assert summary.env_id == spec.env_id
    assert not summary.cached

    # The same env from the agent's memory: no build, READY at once.
    again = BuildStatusWidget(spec.env_id)
    widgets.append(again)
    build_now(spec, agent, "test-widget-2", _NoOutput(), again)  # type: ignore[arg-type]
    assert again.state == "READY"
    assert not again.built


def test_a_failed_build_shows_the_failing_step_and_the_error_tail(
    agent: EmbeddedClient,
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
    widgets: list[BuildStatusWidget],
) -> None:
    offline_installers(monkeypatch, wheelhouse)
    spec = _pip_spec(wheelhouse, "no-such-package-anywhere")
    widget = BuildStatusWidget(spec.env_id)
    widgets.append(widget)

    with pytest.raises(BuildError) as info:
        build_now(spec, agent, "test-widget", _NoOutput(), widget)  # type: ignore[arg-type]

    assert widget.state == "FAILED"
    assert "FAILED" in widget.header.value
    assert widget.error is not None
    assert widget.error["step"] == info.value.step == "pip"  # the error names the plugin
    [failing] = [name for name, s in widget.steps.items() if s["status"] == "failed"]
    assert failing.startswith("pip pip:")
    assert "&#10007;" in widget.table.value  # the failed step's cross (a text glyph)
    assert "no-such-package-anywhere" in widget.log_text
    assert any(line in widget.log_text for line in info.value.output_tail if line.strip())
    text = widget.text()
    assert "  x pip: no-such-package-anywhere (failed)" in text
    # The failed step named by its label, as in the table (not the plugin's key).
    assert info.value.label == "pip: no-such-package-anywhere"
    assert "  failed step pip: no-such-package-anywhere\n" in text  # the tail told the message
    assert "FAILED</b> at <code>pip: no-such-package-anywhere</code>" in widget.header.value
    assert "View log" not in widget.header.value  # the embedded agent: no server log to open
    assert "No solution found" not in widget.table.value  # said once, in the output box
    assert text.splitlines()[-1].startswith(f"runtime env {spec.env_id[:12]} — FAILED (")


def test_a_snapshot_of_the_agent_gives_the_same_picture(
    agent: EmbeddedClient, tmp_path: Path, widgets: list[BuildStatusWidget]
) -> None:
    """What the widget does with the server's agent: ``GET envs/{id}`` and the log."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "mod.py").write_text("X = 1\n")
    spec = parse({"working_dir": str(tmp_path / "code"), "env_vars": {"A": "1"}})
    live = BuildStatusWidget(spec.env_id)
    widgets.append(live)
    build_now(spec, agent, "test-widget", _NoOutput(), live)  # type: ignore[arg-type]

    snapshot = BuildStatusWidget(spec.env_id)
    widgets.append(snapshot)
    env = agent._thread.run(agent.agent.env_status(spec.env_id))
    snapshot.apply_status(env, agent._thread.run(agent.agent.log(spec.env_id)))

    assert snapshot.state == live.state == "READY"
    assert {n: s["status"] for n, s in snapshot.steps.items()} == {
        n: s["status"] for n, s in live.steps.items()
    }
    assert any(name.startswith("working_dir") for name in snapshot.steps)
    assert "1 files" in snapshot.log_text  # the working_dir step's line, with its prefix
    # The step is named by the directory and its file count.
    assert [s["label"] for s in snapshot.steps.values()] == ["working_dir: code/ (1 file)"]


class _PollingClient:
    """The server client's surface (``acquire_sync``, ``env_status_sync``, ``log_sync``) over
    a real embedded agent, without its event stream: the widget has to poll."""

    def __init__(self, client: EmbeddedClient) -> None:
        self._client = client
        self.polls = 0

    def acquire_sync(self, spec: Any, holder: str, *, retry: bool = False) -> Any:
        return self._client.acquire_sync(spec, holder, retry=retry)

    def env_status_sync(self, env_id: str) -> dict[str, Any]:
        self.polls += 1
        env: dict[str, Any] = self._client._thread.run(self._client.agent.env_status(env_id))
        return env

    def log_sync(self, env_id: str) -> str:
        text: str = self._client._thread.run(self._client.agent.log(env_id))
        return text


def test_without_events_the_widget_polls_until_the_end(
    agent: EmbeddedClient,
    wheelhouse: Path,
    monkeypatch: pytest.MonkeyPatch,
    widgets: list[BuildStatusWidget],
) -> None:
    offline_installers(monkeypatch, wheelhouse)
    spec = _pip_spec(wheelhouse, "alpha==1.0")
    client = _PollingClient(agent)
    widget = BuildStatusWidget(spec.env_id)
    widgets.append(widget)

    build_now(spec, client, "test-widget", _NoOutput(), widget)  # type: ignore[arg-type]

    assert client.polls >= 1  # at least the final poll
    assert widget.state == "READY"
    assert any(name.startswith("pip pip:") for name in widget.steps)
    assert all(s["status"] in ("done", "cached") for s in widget.steps.values())
    assert "installing alpha==1.0 with uv" in widget.log_text


def test_the_output_box_is_hidden_while_empty(widgets: list[BuildStatusWidget]) -> None:
    widget = BuildStatusWidget("0" * 64)
    widgets.append(widget)
    assert widget.output.layout.display == "none"
    assert widget.log_text == ""


def test_the_magic_prints_text_in_a_terminal_shell(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not widgets_available(shell)
    shell.run_line_magic("runtime_env", "--env-var MODE=text")
    out = capsys.readouterr().out
    assert " ready: python " in out
    assert " — READY (" not in out  # no widget


def test_the_magic_uses_the_widget_when_available_unless_no_widget(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    magics = shell.magics_manager.registry[RuntimeEnvMagics.__name__]
    assert isinstance(magics, RuntimeEnvMagics)
    magics.widget = True  # as in a kernel whose frontend shows widgets
    try:
        shell.run_line_magic("runtime_env", "--env-var MODE=widget")
        out = capsys.readouterr().out
        spec = api.default_runtime_env()
        assert spec is not None
        # The terminal shows the widget's text/plain form, then the summary line.
        assert " — READY (" in out
        assert out.strip().splitlines()[-1].startswith("runtime env ")
        assert " ready: python " in out

        shell.run_line_magic("runtime_env", "--env-var MODE=forced-text --no-widget")
        out = capsys.readouterr().out
        assert " ready: python " in out
        assert " — READY (" not in out
    finally:
        magics.widget = None


SLOW_BACKEND = """
import os, sys, zipfile

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(directory, config_settings=None, metadata_directory=None):
    for i in range(3):
        print(f"compiling part {i}", flush=True)
    print("backend warning on stderr", file=sys.stderr, flush=True)
    name = "slowpkg-1.0-py3-none-any.whl"
    meta = "slowpkg-1.0.dist-info/"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as wheel:
        wheel.writestr("slowpkg/__init__.py", "X = 1\\n")
        wheel.writestr(meta + "METADATA", "Metadata-Version: 2.1\\nName: slowpkg\\nVersion: 1.0\\n")
        wheel.writestr(
            meta + "WHEEL",
            "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
        )
        wheel.writestr(meta + "RECORD", "")
    return name
"""


def test_a_build_backends_output_reaches_the_widget_as_it_builds(
    agent: EmbeddedClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    widgets: list[BuildStatusWidget],
) -> None:
    """uv shows a backend's output only on failure; the agent asks for it as it comes."""
    monkeypatch.setenv("UV_OFFLINE", "1")
    source = tmp_path / "slowpkg"
    source.mkdir()
    (source / "slow_backend.py").write_text(SLOW_BACKEND)
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "slow_backend"\nbackend-path = ["."]\n'
        '[project]\nname = "slowpkg"\nversion = "1.0"\n'
    )
    spec = parse({"pip": [f"slowpkg @ {source.as_uri()}"]})
    widget = BuildStatusWidget(spec.env_id)
    widgets.append(widget)

    build_now(spec, agent, "test-widget", _NoOutput(), widget)  # type: ignore[arg-type]

    lines = list(widget.lines)
    [built] = [i for i, line in enumerate(lines) if "Built slowpkg" in line]
    for said in ("compiling part 0", "compiling part 2", "backend warning on stderr"):
        [index] = [i for i, line in enumerate(lines) if said in line]
        assert index < built  # streamed while building, not dumped at the end
