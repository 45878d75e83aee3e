"""Remote URIs through fsspec against a real S3 API: moto's server on 127.0.0.1 (started
here), read by s3fs with credentials from the environment, as a user's would be.

A bucket holds a working_dir zip, a py_modules wheel and a requirements file; objects are
changed between builds; missing objects and buckets, absent credentials, protocols without
an installed implementation and Ray's gcs:// are one-line errors naming the field and URI.
Not covered here: real AWS/GCS (no network), and "access denied" (moto's server does not
enforce IAM unless configured to; the mapping is the same code path as "not found").
"""

from __future__ import annotations

import importlib.util
import io
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wheelhouse import build_wheel

from jupyter_runtimeenv.errors import SpecError
from jupyter_runtimeenv.spec import parse

Agent = Callable[..., Any]
SECRET = "s3cr3t-value-that-must-not-be-logged"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh bucket; credentials and the endpoint come from the environment."""
    import boto3

    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTESTING")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    name = f"jre-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=name)

    class Bucket:
        def put(self, key: str, data: bytes) -> str:
            client.put_object(Bucket=name, Key=key, Body=data)
            return f"s3://{name}/{key}"

        uri_of = staticmethod(lambda key: f"s3://{name}/{key}")

    return Bucket()


def zip_of(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buf.getvalue()


async def test_working_dir_py_modules_and_requirements_from_s3(
    bucket: Any, make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    workdir = bucket.put("code/app.zip", zip_of({"app/helper.py": "VALUE = 'from s3'\n"}))
    wheel = build_wheel(tmp_path, "s3wheel", "4.2", [])
    module = bucket.put(f"wheels/{wheel.name}", wheel.read_bytes())
    reqs = bucket.put("reqs/requirements.txt", b"beta\n")
    spec = {"working_dir": workdir, "py_modules": [module], "pip": reqs}
    agent = await make_agent()
    ctx = await agent.get_or_create(spec, "t")
    out = run_in(
        ctx,
        "import helper, s3wheel, beta, alpha;"
        " print(json.dumps([helper.VALUE, s3wheel.__version__, beta.__version__,"
        " alpha.__version__]))",
    )
    assert out == ["from s3", "4.2", "1.0", "2.0"]
    log = await agent.log(ctx.env_id)
    assert f"downloaded {workdir}" in log
    assert SECRET not in log


async def test_a_changed_object_is_fetched_again_an_unchanged_one_is_not(
    bucket: Any, make_agent: Agent, run_in: Callable[..., Any]
) -> None:
    uri = bucket.put("app.zip", zip_of({"mod.py": "V = 1\n"}))
    agent = await make_agent()
    first = await agent.get_or_create({"working_dir": uri}, "t")
    assert run_in(first, "import mod; print(mod.V)") == 1

    # Unchanged: another env using the same object reuses the download, in its own copy.
    other = await agent.get_or_create({"working_dir": uri, "env_vars": {"X": "1"}}, "t")
    assert other.cwd != first.cwd
    assert "downloaded before" in await agent.log(other.env_id)
    assert f"downloaded {uri}" not in await agent.log(other.env_id)

    bucket.put("app.zip", zip_of({"mod.py": "V = 2\n"}))
    changed = await agent.get_or_create({"working_dir": uri}, "t")
    assert changed.env_id != first.env_id
    assert changed.cwd != first.cwd
    assert run_in(changed, "import mod; print(mod.V)") == 2
    assert f"downloaded {uri}" in await agent.log(changed.env_id)


def test_a_changed_requirements_file_changes_the_env_id(bucket: Any) -> None:
    uri = bucket.put("requirements.txt", b"alpha\n")
    first = parse({"pip": uri})
    assert first.get("pip")["packages"] == ["alpha"]
    assert parse({"pip": uri}).env_id == first.env_id
    bucket.put("requirements.txt", b"alpha\nbeta\n")
    assert parse({"pip": uri}).env_id != first.env_id


@pytest.mark.parametrize(
    ("make_spec", "field", "words"),
    [
        (lambda b: {"working_dir": b.uri_of("missing.zip")}, "working_dir", "not found"),
        (
            lambda b: {"py_modules": ["s3://no-such-bucket-jre-test/m.whl"]},
            "py_modules.0",
            "not found",
        ),
        (lambda b: {"pip": b.uri_of("missing.txt")}, "pip", "not found"),
        (
            lambda b: {"working_dir": b.uri_of("no-extension")},
            "working_dir",
            "must name an archive",
        ),
        (lambda b: {"working_dir": "gcs://_ray_pkg_abc.zip"}, "working_dir", "a Ray feature"),
        (lambda b: {"pip": "gcs://_ray_pkg_abc/requirements.txt"}, "pip", "a Ray feature"),
        (lambda b: {"working_dir": "nosuchproto://x/y.zip"}, "working_dir", "no fsspec"),
    ],
)
def test_remote_errors_are_one_line_naming_field_and_uri(
    bucket: Any, make_spec: Callable[[Any], dict[str, Any]], field: str, words: str
) -> None:
    spec = make_spec(bucket)
    with pytest.raises(SpecError) as info:
        parse(spec)
    assert info.value.field == field
    assert words in info.value.reason
    uri = spec.get("working_dir") or spec.get("pip") or spec["py_modules"][0]
    assert uri.split("://")[1].split("/")[0] in str(info.value)
    assert "\n" not in str(info.value)
    assert SECRET not in str(info.value)


def test_no_credentials_is_one_line(
    bucket: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    uri = bucket.put("app.zip", zip_of({"m.py": ""}))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(SpecError) as info:
        parse({"working_dir": uri})
    assert info.value.field == "working_dir"
    assert "no credentials" in info.value.reason
    assert uri in str(info.value)
    # Setting them in the notebook afterwards takes effect at the next parse.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDTESTING")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    assert parse({"working_dir": uri}).get("working_dir") == uri


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_a_protocol_without_its_package_names_the_extra() -> None:
    with pytest.raises(SpecError) as info:
        parse({"working_dir": "gs://bucket/app.zip"})
    assert "jupyter-runtimeenv[gcs]" in str(info.value)


async def test_file_uris_and_redaction(
    make_agent: Agent, run_in: Callable[..., Any], tmp_path: Path
) -> None:
    archive = tmp_path / "code.zip"
    archive.write_bytes(zip_of({"filemod.py": "W = 'file uri'\n"}))
    agent = await make_agent()
    ctx = await agent.get_or_create({"working_dir": f"file://{archive}"}, "t")
    assert run_in(ctx, "import filemod; print(json.dumps(filemod.W))") == "file uri"

    from jupyter_runtimeenv.plugins._remote import redact

    assert redact("s3://user:pw@bucket/k.zip?X-Amz-Signature=abc") == "s3://bucket/k.zip"
