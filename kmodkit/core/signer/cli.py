"""``kmodkit-sign``: the command the signing Job runs.

One JSON object per line on stdout. A failure ends with an ``error`` line whose
``message`` is also the container's termination message (what the operator
shows in status and events): exit 1, or 2 for a wrong command line. No message
holds a byte of the key or a password or token: the key is never read here, and
registry messages name users and hosts only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TextIO

from kmodkit.core.api import RegistryTLS
from kmodkit.core.signer.errors import SignerError, UsageError
from kmodkit.core.signer.sign_image import Request, log_fields, sign_image

TERMINATION_LOG_ENV = "KMODKIT_TERMINATION_LOG"
_TERMINATION_LIMIT = 4096  # the kubelet keeps no more


class JsonLog:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        record = {
            "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": level,
            "event": event,
            **fields,
        }
        self._stream.write(json.dumps(record, default=str) + "\n")
        self._stream.flush()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints a usage text on stderr; the Job's readers want the JSON line.
        raise UsageError(f"{message}; run kmodkit-sign --help for the arguments")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kmodkit-sign",
        description="Sign the kernel modules of an image with sign-file and push the signed "
        "image: the unsigned image's layers plus one layer of signed modules.",
    )
    p.add_argument("--unsigned-image", required=True, help="The image to read the modules from.")
    p.add_argument("--image", required=True, help="Where to push the signed image (a tag).")
    p.add_argument(
        "--file",
        dest="files",
        action="append",
        required=True,
        metavar="PATH",
        help="A module's absolute path in the image, or a glob (*, ?, [...], never across a "
        "/); repeatable. An entry matching no file is an error.",
    )
    p.add_argument("--key", required=True, type=Path, help="The private key (read by sign-file).")
    p.add_argument("--cert", required=True, type=Path, help="The signing certificate.")
    p.add_argument(
        "--docker-config", type=Path, help="A .dockerconfigjson file: registry logins by host."
    )
    p.add_argument("--insecure", action="store_true", help="Push over plain HTTP.")
    p.add_argument(
        "--skip-tls-verify", action="store_true", help="Push without checking the certificate."
    )
    p.add_argument("--insecure-pull", action="store_true", help="Pull over plain HTTP.")
    p.add_argument(
        "--skip-tls-verify-pull",
        action="store_true",
        help="Pull without checking the certificate.",
    )
    p.add_argument(
        "--registry-ca",
        type=Path,
        help="A CA bundle to trust besides the system's (a private registry's); an absent "
        "file is skipped, as an optional ConfigMap volume that was not made. Default: "
        "KMODKIT_REGISTRY_CA.",
    )
    p.add_argument("--platform", default="linux/amd64", help="The platform to pick from an index.")
    p.add_argument("--hash-algo", default="sha256", help="The signature's hash algorithm.")
    p.add_argument("--sign-file", help="sign-file to run (default: found on PATH or in Debian's).")
    return p


def request_from(args: argparse.Namespace) -> Request:
    return Request(
        unsigned_image=args.unsigned_image,
        image=args.image,
        files=tuple(args.files),
        key=args.key,
        cert=args.cert,
        docker_config=args.docker_config,
        push_tls=RegistryTLS(insecure=args.insecure, insecure_skip_tls_verify=args.skip_tls_verify),
        pull_tls=RegistryTLS(
            insecure=args.insecure_pull, insecure_skip_tls_verify=args.skip_tls_verify_pull
        ),
        platform=args.platform,
        hash_algorithm=args.hash_algo,
        sign_file=args.sign_file,
        ca_bundle=_registry_ca(args.registry_ca),
    )


def _registry_ca(given: Path | None) -> str | None:
    if given is not None:
        return str(given) if given.is_file() else None
    return os.environ.get("KMODKIT_REGISTRY_CA") or None


def run(argv: Sequence[str], stdout: TextIO) -> int:
    log = JsonLog(stdout)
    try:
        request = request_from(parser().parse_args(argv))
        log("start", **log_fields(request))
        digest = sign_image(request, log)
    except UsageError as e:
        return _fail(log, str(e), 2)
    except SignerError as e:
        return _fail(log, str(e), 1)
    except Exception as e:  # a bug: still one JSON line and a termination message
        return _fail(log, f"kmodkit-sign crashed: {type(e).__name__}: {e}", 1)
    log("done", digest=digest)
    return 0


def _fail(log: JsonLog, message: str, code: int) -> int:
    log("error", level="error", message=message, exit_code=code)
    given = os.environ.get(TERMINATION_LOG_ENV)
    path = Path(given or "/dev/termination-log")
    # The kubelet mounts the default path; outside a pod it is absent and not made, and a
    # path that cannot be written is skipped.
    if given or path.is_file():
        with contextlib.suppress(OSError), path.open("w") as out:
            out.write(message[:_TERMINATION_LIMIT])
    return code


def main() -> None:
    raise SystemExit(run(sys.argv[1:], sys.stdout))


if __name__ == "__main__":
    main()
