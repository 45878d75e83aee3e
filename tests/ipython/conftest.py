"""Fixtures of the IPython tests: a real ``InteractiveShell`` with the extension loaded, a
real embedded agent on each test's cache as the process-wide client, and the wheelhouse."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
from wheelhouse import make_wheelhouse

from jupyter_runtimeenv import api
from jupyter_runtimeenv.agent import RuntimeEnvAgent
from jupyter_runtimeenv.client import EmbeddedClient, set_client


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=config)
    ip.run_line_magic("load_ext", "jupyter_runtimeenv")
    return ip


@pytest.fixture(autouse=True)
def agent(cache_dir: Path) -> Iterator[EmbeddedClient]:
    """A process-wide embedded client on this test's cache; the session reset after."""
    client = EmbeddedClient(RuntimeEnvAgent(cache_dir))
    old = set_client(client)
    yield client
    api.shutdown()
    set_client(old)
    client.close()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))
