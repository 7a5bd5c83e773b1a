"""A real Kubernetes node next to devcluster's kwok nodes: a kubelet and containerd
in a qemu VM booting Debian's kernel (software emulation), joined to a running
cluster.

The VM is the kernel tier's (``tests/kernel/prepare.sh``, ``vm_init.sh``): it
mounts this machine's root read-only over virtio-9p and runs
``realnode_init.sh`` chrooted into it, so the kubelet is the one devcluster
built, and containerd, runc, the CNI plugins, iptables and socat are this
machine's Debian packages. Its network is qemu's user network with
``restrict=on``: the only ways out are four ``guestfwd`` rules, to the apiserver,
to the registry the node pulls from, to a git daemon serving the node's
``sources/`` (``SOURCES_URL``: what a cluster's internal git server is to a build)
and to an HTTP server of the node's ``files/`` (``FILES_URL``: an internal mirror
of downloads, such as firmware bundles).
The node's directory is shared writable with the VM: its configuration goes in,
the logs of the VM's console, its init, containerd and the kubelet come out
(``RealNode.logs``), and a ``share/`` directory there is a node path pods can
mount (``RealNode.share``).

kwok manages only nodes annotated ``kwok.x-k8s.io/node=fake``; this node has no
such annotation, so kwok leaves it and its pods alone.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import secrets
import shlex
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kmodkit_dev import build, procs, registry, repo
from kmodkit_dev import pki as pki_files
from kmodkit_dev.versions import TOOLS

Echo = Callable[[str], None]
HERE = Path(__file__).parent
PREPARE = repo.ROOT / "tests" / "kernel" / "prepare.sh"
INIT = HERE / "realnode_init.sh"
QEMU = "qemu-system-x86_64"
NODE_NAME = "real-node"
NODE_LABEL = "kmodkit.dev/real-node"
# The kubernetes Service's ClusterIP: the first address of the apiserver's
# --service-cluster-ip-range (cluster.py), where in-cluster clients connect.
SERVICE_IP = "10.96.0.1"
SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")
# Addresses on qemu's user network that lead out of the VM (guestfwd).
API_GUEST = "10.0.2.100:443"
REGISTRY_GUEST = "10.0.2.101:443"
SOURCES_GUEST = "10.0.2.102:9418"
SOURCES_URL = f"git://{SOURCES_GUEST.split(':')[0]}/"
"""Where pods on the node clone ``RealNode.sources``' repositories from (git's own port)."""
GIT_DAEMON = "/usr/lib/git-core/git-daemon"
FILES_GUEST = "10.0.2.103:80"
FILES_URL = f"http://{FILES_GUEST.split(':')[0]}/"
"""Where pods on the node download ``RealNode.files``' files from."""
POD_SUBNET = "10.88.0.0/16"
FORWARD_PLUGIN = "kmodkit-registry-forward"
# The kernel looks for firmware in its own root, the VM's initramfs, which the
# node (chrooted into this machine's root) sees here (tests/kernel/vm_init.sh).
FIRMWARE_ROOT = "/run/kmodkit-test/node/lib/firmware"
PAUSE_IMAGE = "kmodkit.invalid/pause:3.10"
# Bounds, not expectations: under TCG on 2 busy cores the VM boots in well under
# a minute and the kubelet registers within two.
READY_TIMEOUT = 420.0


class RealNodeError(RuntimeError):
    """The node did not come up; the message names the log to read."""


@dataclass(frozen=True)
class RealNode:
    name: str
    dir: Path
    pid: int
    registry_host: str
    registry_user: str
    registry_password: str
    registry_pid: int
    git_pid: int = 0
    files_pid: int = 0
    boot_seconds: float = 0.0
    """From starting qemu to the Node's Ready condition."""

    @property
    def share(self) -> Path:
        """A directory on the node (the same path inside the VM) pods can mount as hostPath."""
        return self.dir / "share"

    @property
    def sources(self) -> Path:
        """Bare git repositories here are served to the node's pods at ``SOURCES_URL``."""
        return self.dir / "sources"

    @property
    def files(self) -> Path:
        """Files here are served to the node's pods at ``FILES_URL``."""
        return self.dir / "files"

    @property
    def logs(self) -> dict[str, Path]:
        return {
            what: self.dir / "logs" / f"{what}.log"
            for what in ("console", "init", "containerd", "kubelet", "git-daemon", "files")
        }

    def registry(self, ca: Path) -> registry.Registry:
        return registry.Registry(
            self.registry_host,
            self.registry_user,
            self.registry_password,
            ca,
            self.registry_pid,
            self.dir / "registry" / "registry.log",
        )

    def log_tails(self, lines: int = 40) -> str:
        """The end of every log, for a failure message."""
        parts = []
        for what, path in self.logs.items():
            try:
                text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            except OSError:
                text = "(none)"
            parts.append(f"--- {what} ({path}) ---\n{text}")
        return "\n".join(parts)


def node_dir(cluster_dir: Path) -> Path:
    return cluster_dir / "realnode"


def load(cluster_dir: Path) -> RealNode | None:
    f = node_dir(cluster_dir) / "node.json"
    if not f.exists():
        return None
    data = json.loads(f.read_text())
    return RealNode(**(data | {"dir": Path(data["dir"])}))


def add_service_names(pki: Path) -> None:
    """Re-issue the apiserver's serving certificate for the kubernetes Service's
    ClusterIP and names too, so in-cluster clients on the real node verify it, as
    every real cluster's certificate allows."""
    pki_files.issue_serving_cert(
        pki,
        (
            "IP:127.0.0.1",
            "DNS:localhost",
            f"IP:{SERVICE_IP}",
            *(f"DNS:{n}" for n in (*SERVICE_NAMES, "kubernetes.default.svc.cluster.local")),
        ),
    )


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _client_cert(pki: Path, out: Path, name: str) -> None:
    """The kubelet's client certificate: user system:node:<name> in group system:nodes,
    what the Node authorizer and NodeRestriction expect."""
    _openssl(
        out,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/O=system:nodes/CN=system:node:{name}",
        "-keyout",
        "kubelet.key",
        "-out",
        "kubelet.csr",
    )
    (out / "kubelet.ext").write_text(
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl(
        out,
        "x509",
        "-req",
        "-in",
        "kubelet.csr",
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-CAserial",
        "kubelet.srl",
        "-days",
        "365",
        "-extfile",
        "kubelet.ext",
        "-out",
        "kubelet.crt",
    )
    (out / "kubelet.key").chmod(0o600)


def kubelet_kubeconfig(server: str, ca: Path, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "devcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": "kubelet",
                "user": {
                    "client-certificate": str(cert_dir / "kubelet.crt"),
                    "client-key": str(cert_dir / "kubelet.key"),
                },
            }
        ],
        "contexts": [{"name": "node", "context": {"cluster": "devcluster", "user": "kubelet"}}],
        "current-context": "node",
    }


def kubelet_config(ca: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        # The VM mounts cgroup v2; kept explicit for a v1 host, where 1.36 still runs.
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": "/var/log/pods",
        "serializeImagePulls": False,
        "registerNode": True,
        # Everything the node writes is the VM's tmpfs: the defaults' percentages
        # of it would evict the tests' pods for no reason.
        "evictionHard": {
            "memory.available": "64Mi",
            "nodefs.available": "2%",
            "imagefs.available": "2%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "/etc/resolv.conf",
        # Grace periods and restarts as on any node; status reported promptly.
        "nodeStatusReportFrequency": "10s",
    }


def containerd_config(node: Path, registry_host: str, ca: Path) -> str:
    return f"""version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{node / "cni-bin"}"
    conf_dir = "{node / "cni"}"
  # containerd 1.6 talks plain HTTP to a loopback registry unless told the endpoint.
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{registry_host}"]
    endpoint = ["https://{registry_host}"]
  [plugins."io.containerd.grpc.v1.cri".registry.configs."{registry_host}".tls]
    ca_file = "{ca}"
"""


def cni_config(registry_port: int) -> dict[str, Any]:
    # containerd adds the loopback interface itself.
    return {
        "cniVersion": "1.0.0",
        "name": "kmodkit-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": FORWARD_PLUGIN, "port": registry_port, "to": REGISTRY_GUEST},
        ],
    }


def cni_bin(node: Path) -> None:
    """Debian's CNI plugins and the registry forward (realnode_cni_forward.py)."""
    bin_dir = node / "cni-bin"
    bin_dir.mkdir(exist_ok=True)
    for plugin in ("bridge", "host-local", "loopback"):
        link = bin_dir / plugin
        link.unlink(missing_ok=True)
        link.symlink_to(Path("/usr/lib/cni") / plugin)
    forward = bin_dir / FORWARD_PLUGIN
    forward.write_bytes((Path(__file__).parent / "realnode_cni_forward.py").read_bytes())
    forward.chmod(0o755)


def node_env(settings: dict[str, str]) -> str:
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in settings.items())


def _gz_tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (content, mode) in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(content), mode, 1_700_000_000
            tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue(), mtime=0)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(name: str, pause: bytes) -> bytes:
    """An OCI image layout (tar) of one image, ``pause`` as its entrypoint, named ``name``
    for ``ctr images import``."""
    layer = _gz_tar({"pause": (pause, 0o755)})
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [_sha(gzip.decompress(layer))]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _sha(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _sha(layer),
                    "size": len(layer),
                }
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _sha(manifest),
                    "size": len(manifest),
                    "annotations": {"io.containerd.image.name": name},
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
    ).encode()
    files = {
        "oci-layout": (b'{"imageLayoutVersion": "1.0.0"}', 0o644),
        "index.json": (index, 0o644),
        **{f"blobs/sha256/{_sha(b)[7:]}": (b, 0o644) for b in (layer, config, manifest)},
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path, (content, mode) in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
    return raw.getvalue()


def _pause(out: Path) -> bytes:
    """Kubernetes' own pause (its source ships in the kubernetes module), built static."""
    source = build.tool_file("kubernetes", "pause.c")
    binary = out / "pause"
    subprocess.run(
        [
            "gcc",
            "-Os",
            "-static",
            f"-DVERSION={TOOLS['kubernetes'].version}",
            "-o",
            str(binary),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["strip", str(binary)], check=True)
    return binary.read_bytes()


def prepare_kernel(echo: Echo) -> Path:
    """The kernel tier's cache (kernel, modules, initramfs): prepare.sh's last line."""
    # The signature recipe's virt-fw-vars comes with the dev extras, beside this Python.
    done = subprocess.run(
        ["sh", str(PREPARE)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "KMODKIT_PYTHON": sys.executable},
    )
    if done.returncode != 0:
        raise RealNodeError(f"{PREPARE} failed:\n{done.stderr[-4000:]}")
    cache = Path(done.stdout.strip().splitlines()[-1])
    echo(f"devcluster:   kernel {cache.name} prepared")
    return cache


def qemu_argv(
    kernel: Path, node: Path, api_port: int, registry_port: int, git_port: int,
    files_port: int, memory_mb: int = 4096,
) -> list[str]:  # fmt: skip
    version = kernel.name
    forward = "socat STDIO TCP:127.0.0.1:{}"
    netdev = ",".join(
        [
            "user",
            "id=net0",
            "restrict=on",
            f"guestfwd=tcp:{API_GUEST}-cmd:{forward.format(api_port)}",
            f"guestfwd=tcp:{REGISTRY_GUEST}-cmd:{forward.format(registry_port)}",
            f"guestfwd=tcp:{SOURCES_GUEST}-cmd:{forward.format(git_port)}",
            f"guestfwd=tcp:{FILES_GUEST}-cmd:{forward.format(files_port)}",
        ]
    )
    # One vCPU, as the kernel tier: with two, a loaded host starved one TCG vCPU
    # thread and the guest hung in soft lockups (kubelet on one CPU, ksoftirqd on the other).
    return [
        QEMU,
        "-machine", "accel=tcg",
        "-cpu", "max",
        "-m", str(memory_mb),
        "-smp", "1",
        "-nographic",
        "-vga", "none",
        "-no-reboot",
        "-kernel", str(kernel / "image" / "boot" / f"vmlinuz-{version}"),
        "-initrd", str(kernel / "initramfs.cpio.gz"),
        "-append",
        " ".join(
            [
                "console=ttyS0 panic=-1 quiet loglevel=1",
                f"KMODKIT_ENTRY={INIT}",
                f"KMODKIT_NODE_DIR={node}",
            ]
        ),
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        "-virtfs",
        f"local,path={node},mount_tag=nodedir,security_model=none,multidevs=remap",
        "-netdev", netdev,
        "-device", "virtio-net-pci,netdev=net0",
    ]  # fmt: skip


def start(
    cluster_dir: Path,
    pki: Path,
    api_port: int,
    kubeconfig: Path,
    echo: Echo,
    started: Callable[[str, int], None],
    name: str = NODE_NAME,
) -> RealNode:
    """Boot the node VM for the cluster whose apiserver listens on ``api_port``, with a
    registry of its own it can pull from, and wait until its Node is Ready.

    ``started(binary, pid)`` is told of each process as it starts (the registry, qemu),
    so the cluster's ``down`` stops them even when this fails."""
    build.ensure(["kubernetes", "registry"], echo)
    kernel = prepare_kernel(echo)
    node = node_dir(cluster_dir)
    for sub in ("logs", "cni", "share", "certs", "sources", "files"):
        (node / sub).mkdir(parents=True, exist_ok=True)
    ca = pki / "ca.crt"
    password = secrets.token_urlsafe(24)
    reg = registry.start(node / "registry", "kmodkit", password, pki_dir=pki)
    started("registry", reg.pid)
    registry_port = int(reg.host.rsplit(":", 1)[1])
    git_port = procs.free_port()
    # Read-only (no receive-pack), on loopback: only the VM's guestfwd reaches it.
    git_pid = procs.spawn(
        [
            GIT_DAEMON, "--reuseaddr", "--listen=127.0.0.1", f"--port={git_port}",
            "--export-all", "--informative-errors", f"--base-path={node / 'sources'}",
            str(node / "sources"),
        ],
        node / "logs" / "git-daemon.log",
    )  # fmt: skip
    started("git-daemon", git_pid)
    files_port = procs.free_port()
    # The interpreter itself (not a venv's link to it): down() knows a process by its exe.
    python = os.path.realpath(sys.executable)
    files_pid = procs.spawn(
        [
            python, "-m", "http.server", "--bind", "127.0.0.1",
            f"--directory={node / 'files'}", str(files_port),
        ],
        node / "logs" / "files.log",
    )  # fmt: skip
    started(python, files_pid)
    _client_cert(pki, node / "certs", name)
    server = f"https://127.0.0.1:{api_port}"
    (node / "kubelet.kubeconfig").write_text(
        json.dumps(kubelet_kubeconfig(server, ca, node / "certs"))
    )
    (node / "kubelet.yaml").write_text(json.dumps(kubelet_config(ca)))
    (node / "containerd.toml").write_text(containerd_config(node, reg.host, ca))
    (node / "cni" / "10-kmodkit.conflist").write_text(json.dumps(cni_config(registry_port)))
    cni_bin(node)
    (node / "pause.tar").write_bytes(oci_archive(PAUSE_IMAGE, _pause(node / "certs")))
    (node / "node.env").write_text(
        node_env(
            {
                "NODE_NAME": name,
                "NODE_LABELS": f"{NODE_LABEL}=true",
                "NODE_MODULES": str(kernel / "image" / "lib" / "modules" / kernel.name),
                "NODE_KUBELET": str(build.binary("kubelet")),
                "NODE_API_PORT": str(api_port),
                "NODE_API_GUEST": API_GUEST,
                "NODE_REGISTRY_PORT": str(registry_port),
                "NODE_REGISTRY_GUEST": REGISTRY_GUEST,
                "NODE_SERVICE_IP": SERVICE_IP,
            }
        )
    )
    booted = time.monotonic()
    pid = procs.spawn(
        qemu_argv(kernel, node, api_port, registry_port, git_port, files_port),
        node / "logs" / "console.log",
    )
    started(QEMU, pid)
    real = RealNode(
        name, node, pid, reg.host, reg.username, reg.password, reg.pid, git_pid, files_pid
    )
    _wait_ready(real, kubeconfig)
    real = RealNode(**(asdict(real) | {"boot_seconds": round(time.monotonic() - booted, 1)}))
    (node / "node.json").write_text(json.dumps(asdict(real) | {"dir": str(node)}, indent=2))
    echo(f"devcluster:   real node {name!r} Ready ({real.boot_seconds:.0f}s after qemu started)")
    return real


def _wait_ready(real: RealNode, kubeconfig: Path, timeout: float = READY_TIMEOUT) -> None:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    untyped: Any = config
    api: Any = client.CoreV1Api(untyped.new_client_from_config(config_file=str(kubeconfig)))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.runs(real.pid, QEMU):
            raise RealNodeError(f"the node VM exited during start-up\n{real.log_tails()}")
        try:
            conditions = api.read_node(real.name).status.conditions or []
        except ApiException as err:
            if err.status != 404:
                raise
            conditions = []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            return
        time.sleep(1)
    raise RealNodeError(f"node {real.name!r} not Ready after {timeout:.0f}s\n{real.log_tails()}")
