"""``kmodkit-sign``'s command line: JSON lines, exit codes, the termination message.

Only failures found before any network request: the registry runs are in
tests/integration/test_signer.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from kmodkit.core.signer.cli import run
from tests.unit.core.signer.test_certificate import SELF_SIGNED


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    key.write_text("not read by kmodkit-sign")
    cert.write_bytes(SELF_SIGNED)
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("KMODKIT_TERMINATION_LOG", str(termination))
    return {"key": key, "cert": cert, "termination": termination}


def _run(files: dict[str, Path], *args: str, **flags: str) -> tuple[int, list[dict[str, Any]]]:
    base = {
        "--unsigned-image": "registry.example.com/driver:unsigned",
        "--image": "registry.example.com/driver:signed",
        "--file": "/opt/lib/modules/6.1.0/extra/x.ko",
        "--key": str(files["key"]),
        "--cert": str(files["cert"]),
    }
    base.update({f"--{k.replace('_', '-')}": v for k, v in flags.items()})
    argv = [part for flag, value in base.items() if value for part in (flag, value)]
    out = io.StringIO()
    code = run([*argv, *args], out)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"image": ""}, "the following arguments are required: --image"),
        ({"file": "x.ko"}, "--file 'x.ko' is not an absolute path"),
        (
            {"image": "registry.example.com/driver@sha256:" + "a" * 64},
            "must name a tag and no digest",
        ),
        ({"unsigned_image": "registry.example.com/Driver:1"}, "--unsigned-image"),
        ({"unsigned_image": "registry.example.com/driver"}, "names no tag or digest"),
        ({"platform": "amd64"}, "--platform 'amd64' is not os/architecture"),
        ({"hash_algo": "md5"}, "--hash-algo 'md5'"),
        ({"key": "/nonexistent/key.pem"}, "--key /nonexistent/key.pem is not a readable file"),
        ({"sign_file": "/nonexistent/sign-file"}, "--sign-file /nonexistent/sign-file"),
    ],
)
def test_a_wrong_command_line_exits_2_with_one_json_error_line_and_the_reason(
    files: dict[str, Path], flags: dict[str, str], message: str
) -> None:
    code, lines = _run(files, **flags)
    assert code == 2
    assert lines[-1]["event"] == "error" and lines[-1]["level"] == "error"
    assert message in lines[-1]["message"]
    assert lines[-1]["exit_code"] == 2
    assert files["termination"].read_text() == lines[-1]["message"]


def test_a_certificate_that_is_not_one_is_named(files: dict[str, Path]) -> None:
    files["cert"].write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    code, lines = _run(files)
    assert code == 2
    assert lines[-1]["message"] == (
        f"--cert {files['cert']}: it is PEM but holds no CERTIFICATE block; "
        "give the signing certificate"
    )


def test_a_malformed_docker_config_is_named_without_its_content(
    files: dict[str, Path], tmp_path: Path
) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"auths": {"registry.example.com": {"auth": "c2VjcmV0LXBhc3N3b3Jk"}}}')
    code, lines = _run(files, docker_config=str(config), sign_file=str(files["key"]))
    assert code == 2
    message = lines[-1]["message"]
    assert message.startswith(
        f"--docker-config {config} has an \"auth\" for 'registry.example.com'"
    )
    assert "c2VjcmV0" not in message and "secret" not in message


def test_the_start_line_names_the_request(files: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text("{}")
    code, lines = _run(files, docker_config=str(config), unsigned_image="bad image")
    assert code == 2
    assert [line["event"] for line in lines] == ["start", "error"]
    assert lines[0]["files"] == ["/opt/lib/modules/6.1.0/extra/x.ko"]


def test_a_registry_ca_is_trusted_when_present_and_skipped_when_absent(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KMODKIT_REGISTRY_CA", raising=False)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(SELF_SIGNED)
    _, lines = _run(files, registry_ca=str(ca), unsigned_image="bad image")
    assert lines[0]["registry_ca"] == str(ca)
    # An optional ConfigMap that was not made mounts an empty directory.
    _, lines = _run(files, registry_ca=str(tmp_path / "absent.crt"), unsigned_image="bad image")
    assert lines[0]["registry_ca"] == "the system's only"
