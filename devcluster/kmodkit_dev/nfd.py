"""node-feature-discovery's master on the local control plane.

nfd-master (built from the Go module proxy, see versions.py) turns NodeFeature
objects and NodeFeatureRules into node labels, as in a real cluster. Its
workers read a real host's PCI bus and kernel; kwok nodes have neither, so a
test writes each node's NodeFeature itself, as the worker would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kmodkit_dev import build, procs

NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"


def crds() -> list[dict[str, Any]]:
    """NFD's own CRDs (NodeFeature, NodeFeatureRule, NodeFeatureGroup), from its source."""
    build.ensure(["nfd"])
    text = build.tool_file("nfd", "nfd-api-crds.yaml").read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc]


@contextlib.contextmanager
def running_master(
    kubeconfig: str, log: Path, node: str, extra_label_namespaces: Sequence[str] = ()
) -> Iterator[None]:
    """nfd-master against the cluster until the block ends, as if it ran on ``node``
    (it records its version on the node it runs on)."""
    build.ensure(["nfd"])
    binary = str(build.binary("nfd-master"))
    argv = [
        binary,
        f"-kubeconfig={kubeconfig}",
        f"-port={procs.free_port()}",
        "-config=/dev/null",
        "-resync-period=10s",
    ]
    if extra_label_namespaces:
        argv.append(f"-extra-label-ns={','.join(extra_label_namespaces)}")
    pid = procs.spawn(argv, log, env={**os.environ, "NODE_NAME": node})
    try:
        yield
    finally:
        procs.stop(pid, binary)


def node_feature(
    node: str,
    namespace: str,
    pci_devices: Sequence[Mapping[str, str]] = (),
    loaded_modules: Sequence[str] = (),
) -> dict[str, Any]:
    """The NodeFeature an nfd-worker on ``node`` would write: its PCI devices (vendor,
    class, device) and its loaded kernel modules."""
    return {
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1",
        "kind": "NodeFeature",
        "metadata": {"name": node, "namespace": namespace, "labels": {NODE_NAME_LABEL: node}},
        "spec": {
            "features": {
                "flags": {"kernel.loadedmodule": {"elements": {m: {} for m in loaded_modules}}},
                "instances": {
                    "pci.device": {"elements": [{"attributes": dict(d)} for d in pci_devices]}
                },
            }
        },
    }
