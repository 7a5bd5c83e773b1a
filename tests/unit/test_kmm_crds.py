"""Where KMM's CRDs come from, and that only the pinned bytes are ever used.

The download is served by a loopback HTTP server, so no test reaches the
network; the files are stand-ins with their own sums.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kmodkit_dev import kmm_crds
from kmodkit_dev.kmm_crds import ENV, KmmCrdError, crd_files

FILES = {"a.yaml": b"kind: A\n", "b.yaml": b"kind: B\n"}
SUMS = {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}
# Nothing listens on port 9 of loopback (discard): reaching it fails at once.
UNREACHABLE = "http://127.0.0.1:9/crds"


def _write(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


class _Server:
    def __init__(self, root: Path) -> None:
        self.requests: list[str] = []
        served = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                served.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), partial(Handler, directory=str(root))
        )
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/crds"
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    servers: list[_Server] = []

    def start(files: dict[str, bytes]) -> _Server:
        root = tmp_path / f"served-{len(servers)}"
        _write(root / "crds", files)
        servers.append(_Server(root))
        return servers[-1]

    yield start
    for server in servers:
        server.httpd.shutdown()
        server.httpd.server_close()


def _crd_files(tmp_path: Path, **given: Any) -> list[Path]:
    """``crd_files`` with no local copy, an empty cache and an unreachable server, unless given."""
    options: dict[str, Any] = {
        "env": {},
        "shared": tmp_path / "no-shared-copy",
        "cache": tmp_path / "cache",
        "base_url": UNREACHABLE,
        "sums": SUMS,
    }
    return crd_files(**{**options, **given})


def test_the_shared_copy_is_used_when_it_exists(tmp_path: Path) -> None:
    shared = _write(tmp_path / "shared" / "kmm-crds", FILES)
    assert _crd_files(tmp_path, shared=shared) == [shared / "a.yaml", shared / "b.yaml"]


def test_the_environment_names_another_directory(tmp_path: Path) -> None:
    shared = _write(tmp_path / "shared", FILES)
    chosen = _write(tmp_path / "checkout" / "config" / "crd" / "bases", FILES)
    paths = _crd_files(tmp_path, env={ENV: str(chosen)}, shared=shared)
    assert [p.parent for p in paths] == [chosen, chosen]


def test_a_changed_local_file_fails_naming_it(tmp_path: Path) -> None:
    shared = _write(tmp_path / "shared", {**FILES, "b.yaml": b"kind: B\nextra: 1\n"})
    with pytest.raises(KmmCrdError) as err:
        _crd_files(tmp_path, shared=shared)
    message = str(err.value)
    assert f"b.yaml from {shared} has sha256 " in message
    assert f"not the pinned {SUMS['b.yaml']}" in message
    assert kmm_crds.COMMIT in message


def test_a_missing_local_file_fails_naming_it(tmp_path: Path) -> None:
    chosen = _write(tmp_path / "bases", {"a.yaml": FILES["a.yaml"]})
    with pytest.raises(KmmCrdError, match=rf"b\.yaml is missing from {chosen} \({ENV}\)"):
        _crd_files(tmp_path, env={ENV: str(chosen)})


def test_without_a_local_copy_the_files_are_downloaded_once(tmp_path: Path, serve: Any) -> None:
    server = serve(FILES)
    paths = _crd_files(tmp_path, base_url=server.url)
    assert paths == [tmp_path / "cache" / "a.yaml", tmp_path / "cache" / "b.yaml"]
    assert [p.read_bytes() for p in paths] == list(FILES.values())
    assert server.requests == ["/crds/a.yaml", "/crds/b.yaml"]
    assert _crd_files(tmp_path) == paths


def test_a_download_with_the_wrong_sum_fails_and_is_not_kept(tmp_path: Path, serve: Any) -> None:
    server = serve({**FILES, "a.yaml": b"kind: NotA\n"})
    with pytest.raises(KmmCrdError) as err:
        _crd_files(tmp_path, base_url=server.url)
    assert f"a.yaml from {server.url}/a.yaml has sha256 " in str(err.value)
    assert not (tmp_path / "cache" / "a.yaml").exists()


def test_a_corrupted_cached_file_is_downloaded_again(tmp_path: Path, serve: Any) -> None:
    server = serve(FILES)
    _write(tmp_path / "cache", {**FILES, "b.yaml": b"truncat"})
    paths = _crd_files(tmp_path, base_url=server.url)
    assert paths[1].read_bytes() == FILES["b.yaml"]
    assert server.requests == ["/crds/b.yaml"]


def test_a_file_the_server_does_not_have_fails_naming_the_address(
    tmp_path: Path, serve: Any
) -> None:
    server = serve({"a.yaml": FILES["a.yaml"]})
    with pytest.raises(KmmCrdError, match=rf"cannot download b\.yaml from {server.url}/b\.yaml"):
        _crd_files(tmp_path, base_url=server.url)
