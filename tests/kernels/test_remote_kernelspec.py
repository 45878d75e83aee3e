"""``kernelspec install --dask``: the kernel.json of a kernel on a cluster, through the command
and the Python API, and the one-line refusals of bad input (nothing is written then)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from jupyter_runtimeenv.cli import main
from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.kernels import install_kernelspec
from jupyter_runtimeenv.kernels.remote import PROVISIONER_NAME, DaskKernelProvisioner


def kernels_in(prefix: Path) -> dict[str, str]:
    specs = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    names = set(specs.find_kernel_specs()) - {"python3"}  # ipykernel's own is always there
    return {name: specs.get_kernel_spec(name).display_name for name in names}


def test_the_command_writes_a_cluster_kernelspec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "env.yaml"
    (tmp_path / "code").mkdir()
    spec.write_text("working_dir: code\nenv_vars: {K: v}\n")
    prefix = tmp_path / "p"
    code = main([
        "kernelspec", "install", "crunch", str(spec), "--prefix", str(prefix),
        "--dask", "tcp://10.0.0.5:8786", "--node-cache-dir", "/scratch/jre-{name}",
    ])  # fmt: skip
    assert code == 0
    assert "Dask cluster at tcp://10.0.0.5:8786" in capsys.readouterr().out
    kernel = json.loads((prefix / "share/jupyter/kernels/crunch/kernel.json").read_text())
    assert kernel["display_name"] == "crunch (cluster)"
    provisioner = kernel["metadata"]["kernel_provisioner"]
    assert provisioner["provisioner_name"] == PROVISIONER_NAME
    config = provisioner["config"]
    assert config["scheduler"] == "tcp://10.0.0.5:8786"
    assert config["node_cache_dir"] == "/scratch/jre-{name}"
    # Local paths became absolute at install: the server ships their content at start.
    assert config["runtime_env"]["working_dir"] == str(tmp_path / "code")
    assert config["runtime_env"]["env_vars"] == {"K": "v"}
    assert kernel["metadata"]["debugger"] is False
    assert kernel["metadata"]["supported_encryption"] == ["curve"]
    # Python's logos, for the Launcher's card.
    assert (prefix / "share/jupyter/kernels/crunch/logo-64x64.png").is_file()
    assert kernels_in(prefix) == {"crunch": "crunch (cluster)"}
    # jupyter_client can make the provisioner from it, with the kernelspec's config.
    provisioner_class = DaskKernelProvisioner(**config)
    assert provisioner_class.scheduler == "tcp://10.0.0.5:8786"


def test_the_python_api_takes_a_display_name(tmp_path: Path) -> None:
    install_kernelspec(
        "big", {}, prefix=str(tmp_path), dask="tls://sched.example:8786", display_name="Big data"
    )
    assert kernels_in(tmp_path) == {"big": "Big data (cluster)"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dask", "sched:8786"], "--dask 'sched:8786': expected a Dask scheduler address"),
        (["--dask", "tcp://a b:1"], "--dask 'tcp://a b:1': expected a Dask scheduler address"),
        (["--node-cache-dir", "/x"], "--node-cache-dir needs --dask"),
        (
            ["--dask", "tcp://h:1", "--node-cache-dir", "/x/{host}"],
            "--node-cache-dir '/x/{host}': only {name} and {id} may be used",
        ),
        (
            ["--dask", "tcp://h:1", "--node-cache-dir", "relative/{name}"],
            "--node-cache-dir 'relative/{name}': must be an absolute path",
        ),
    ],
)
def test_bad_cluster_options_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    prefix = tmp_path / "p"
    code = main(["kernelspec", "install", "k", "{}", "--prefix", str(prefix), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert message in err
    assert not (prefix / "share/jupyter/kernels/k").exists()


def test_the_api_refuses_the_same(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="expected a Dask scheduler address"):
        install_kernelspec("k", {}, prefix=str(tmp_path), dask="localhost")
