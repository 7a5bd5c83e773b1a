"""Pinned versions of every binary devcluster runs.

Each tool is built from the Go module proxy by its own wrapper module in
``gomod/<tool>/`` (separate modules so one tool's dependency pins never force
another's). Changing a version here means regenerating that tool's go.mod.
A tool with ``deb`` set is taken from that Debian package instead, at exactly
``version``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tool:
    name: str  # also the wrapper module's directory under gomod/
    version: str
    packages: tuple[str, ...]  # Go main packages built into binaries
    binaries: tuple[str, ...]  # the executables the build leaves behind
    ldflags: str = "-s -w"
    files: tuple[tuple[str, str], ...] = ()
    """(module, path in it) copied next to the binaries: manifests the tool's source ships."""
    deb: str = ""
    """A Debian package whose ``/usr/bin`` holds the binaries (``packages`` is then empty)."""


KUBERNETES_VERSION = "v1.36.3"


def _k8s_ldflags(version: str) -> str:
    # Without stamping, the binaries report v0.0.0 and helm's kubeVersion
    # checks and every client's version parsing go wrong.
    minor = version.split(".")[1]
    flags = ["-s -w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor=1",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


# The kubelet runs only on devcluster's real node (kmodkit_dev.realnode).
_K8S_COMMANDS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
)

TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "kubernetes",
            KUBERNETES_VERSION,
            tuple(f"k8s.io/kubernetes/cmd/{c}" for c in _K8S_COMMANDS),
            _K8S_COMMANDS,
            _k8s_ldflags(KUBERNETES_VERSION),
            # The real node's sandbox (pause) image is built from upstream's source.
            files=(("k8s.io/kubernetes", "build/pause/linux/pause.c"),),
        ),
        Tool("etcd", "v3.6.16", ("go.etcd.io/etcd/server/v3",), ("etcd",)),
        Tool("kwok", "v0.8.0", ("sigs.k8s.io/kwok/cmd/kwok",), ("kwok",)),
        Tool(
            "registry",
            "v3.1.1",
            ("github.com/distribution/distribution/v3/cmd/registry",),
            ("registry",),
        ),
        Tool("helm", "v3.22.0", ("helm.sh/helm/v3/cmd/helm",), ("helm",)),
        # The current Helm; the chart is tested with both.
        Tool("helm4", "v4.3.1", ("helm.sh/helm/v4/cmd/helm",), ("helm4",)),
        # krew's own manifest validator and installer, for the kubectl plugin's manifest.
        Tool(
            "krew",
            "v0.4.3",
            ("sigs.k8s.io/krew/cmd/krew", "sigs.k8s.io/krew/cmd/validate-krew-manifest"),
            ("krew", "validate-krew-manifest"),
        ),
        Tool(
            "nfd",
            "v0.18.2",
            ("sigs.k8s.io/node-feature-discovery/cmd/nfd-master",),
            ("nfd-master",),
            files=(
                (
                    "sigs.k8s.io/node-feature-discovery",
                    "deployment/base/nfd-crds/nfd-api-crds.yaml",
                ),
            ),
        ),
        # The rules checker (promtool check/test rules). Debian's package, not a Go
        # build: prometheus' main module pulls every cloud SDK its service discovery uses.
        Tool("promtool", "2.42.0+ds-5+deb12u1", (), ("promtool",), deb="prometheus"),
    )
}

# What `kmodkit dev up` needs; the registry and helm are built when a test or
# the demo first asks for them.
CONTROL_PLANE = ("etcd", "kubernetes", "kwok")
