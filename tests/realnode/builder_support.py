"""Running kmodkit-build on this machine the way a build Job's pod would.

The Job's container arguments are taken from the product's own ``build_job``;
each path the pod would mount is mapped to a directory on this machine holding
what the volume would (the ConfigMap's Dockerfile, the Secrets' files, the
host's /lib/modules, an empty directory for buildah's storage).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kmodkit.core.api import Module
from kmodkit.core.engine.build_plan import BuildSettings, build_job
from kmodkit.core.engine.loader_plan import plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.nodes import NodeView
from kmodkit_dev.registry import Registry
from tests.integration.oci_images import Member, layer

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILDER = REPO_ROOT / "dockerfiles" / "builder" / "kmodkit-build"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: one static binary
APPLETS = ("sh", "test", "echo", "cat", "ls", "mkdir")
KERNEL = "6.1.0-99-amd64"
"""The node's kernel: the one its /lib/modules holds, as ``Pod`` stands it in."""


def busybox_layer() -> bytes:
    """A base image's one layer: busybox and the applets the test Dockerfile runs, merged
    /usr as Debian has it."""
    members = [
        Member("usr", None, 0o755),
        Member("usr/bin", None, 0o755),
        Member("usr/bin/busybox", BUSYBOX.read_bytes(), 0o755),
        *(Member(f"usr/bin/{name}", symlink="busybox") for name in APPLETS),
        Member("bin", symlink="usr/bin"),  # RUN steps start /bin/sh
        Member("tmp", None, 0o1777),
    ]
    return layer(members)


def job_container(module: Module, kernel: str, settings: BuildSettings) -> dict[str, Any]:
    """The build Job's container and pod volumes, as the engine makes them for ``kernel``."""
    node = NodeView("build-node", {}, kernel, "amd64", True)
    first = plan(module, [node], [], {}, LoaderSettings(agent_image="unused"))
    ((image, resolved),) = first.needed_images.items()
    job = build_job(module, image, resolved, 1, [node.name], settings, "inputs")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return {**container, "volumes": pod["volumes"]}


def authfile(logins: dict[str, tuple[str, str]]) -> str:
    """Docker's config.json for ``{host: (user, password)}``, as a pull secret holds it."""
    auths = {
        host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
        for host, (user, password) in logins.items()
    }
    return json.dumps({"auths": auths})


@dataclass
class Pod:
    """The directories that stand for the pod's volumes, under ``root``."""

    root: Path
    dockerfile: str
    secrets: dict[str, dict[str, str]]
    """Secret name -> its files."""
    auth: str
    registries: list[Registry]

    def paths(self, container: dict[str, Any]) -> dict[str, str]:
        """Each mountPath of the container -> the directory standing for its volume."""
        volumes = {v["name"]: v for v in container["volumes"]}
        found = {}
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            here = self.root / mount["name"]
            here.mkdir(parents=True, exist_ok=True)
            if "hostPath" in volume:
                # The node's directory (its /lib/modules: one kernel's), made here: this
                # machine's may be missing (a VM booted without modules) or hold anything.
                (here / KERNEL).mkdir(exist_ok=True)
            elif "configMap" in volume:
                (here / "Dockerfile").write_text(self.dockerfile)
            elif volume["name"] == "registry-auth":
                (here / "config.json").write_text(self.auth)
            elif "secret" in volume:
                for key, value in self.secrets[volume["secret"]["secretName"]].items():
                    (here / key).write_text(value)
            found[mount["mountPath"]] = str(here)
        return found

    def run(self, container: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], str]:
        """kmodkit-build with the container's arguments, each mounted path mapped; the
        process and its termination message."""
        paths = self.paths(container)
        args = [_mapped(arg, paths) for arg in container["args"]]
        # The registries' test CAs, which a cluster's builder image would trust.
        certs = self.root / "certs"
        certs.mkdir(exist_ok=True)
        for n, registry in enumerate(self.registries):
            assert registry.ca is not None
            shutil.copy(registry.ca, certs / f"registry-{n}.crt")
        storage = Path(paths["/var/lib/containers"])
        conf = self.root / "storage.conf"
        conf.write_text(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{storage}"\nrunroot = "{self.root / "run"}"\n'
        )
        message = self.root / "termination-log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(self.root),
            "TMPDIR": str(self.root),
            "CONTAINERS_STORAGE_CONF": str(conf),
            "KMODKIT_TERMINATION_LOG": str(message),
        }
        done = subprocess.run(
            [str(BUILDER), *args, f"--cert-dir={certs}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        return done, message.read_text() if message.exists() else ""


def _mapped(arg: str, paths: dict[str, str]) -> str:
    """``--flag=/mounted/path...`` with the mount's path replaced by its stand-in. In a
    ``--run-volume=DIR:PATH`` only DIR is the pod's: the RUN steps see PATH as in the pod."""
    flag, sep, value = arg.partition("=")
    for mounted in sorted(paths, key=len, reverse=True):
        if value == mounted or value.startswith((mounted + "/", mounted + ":")):
            return f"{flag}{sep}{paths[mounted]}{value[len(mounted) :]}"
    return arg
