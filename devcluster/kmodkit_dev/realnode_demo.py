"""``make demo REAL_NODE=1``: the Tenstorrent flows live on the real node (``realnode``).

The builder and flasher images are the product's, built here from Debian's archive and
pushed to the node's registry. tt-kmd comes from a git mirror the node serves and the
firmware bundle from its file server (``tenstorrent_mirror``). Nothing plays a part: the
builder pod builds tt-kmd against the VM kernel's headers, loads it and labels its node;
the flash Job flashes the stand-in device and tt-smi reads it back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kmodkit.backends.tenstorrent import keys
from kmodkit_dev import cluster, images, realnode, tenstorrent_demo, tenstorrent_mirror

KMD_VERSION = "2.0.0"
FW_VERSION = "80.18.0"
BUNDLE = f"fw_pack-{FW_VERSION}.fwbundle"
REPOSITORY = "tt-kmd.git"
PULL_SECRET = "real-node-registry"
BUILDER_ACCOUNT = "tt-builder"
# Bounds for a slow machine: the builder image's pull and tt-kmd's build run under emulation.
TIMEOUT = 1200.0


def prepare(c: cluster.Cluster, api: Any, ns: str, echo: Callable[[str], None]) -> dict[str, str]:
    """The node's images, mirror and bundle, and the pods' accounts as the chart makes them
    (the pull secret; the builder's right to label nodes); returns the operator's settings."""
    from kubernetes import client

    real = realnode.load(c.dir)
    if real is None:
        raise RuntimeError(f"cluster {c.name!r} has no real node")
    registry = real.registry(c.pki / "ca.crt")
    echo("    building the builder and flasher images (cached by content after the first run)")
    with images.login_file(registry.host, registry.username, registry.password) as authfile:
        destination = images.Destination(registry.host, registry.ca, authfile)
        built = images.build_images(["tenstorrent-builder", "tenstorrent-flasher"], destination)
    tenstorrent_mirror.kmd_repository(real.sources / REPOSITORY, [KMD_VERSION])
    (real.files / BUNDLE).write_bytes(tenstorrent_mirror.firmware_bundle(f"{FW_VERSION}.0"))

    core: Any = client.CoreV1Api(api)
    rbac: Any = client.RbacAuthorizationV1Api(api)
    core.create_namespaced_secret(ns, registry.pull_secret(PULL_SECRET))
    pulls = {"imagePullSecrets": [{"name": PULL_SECRET}]}
    core.create_namespaced_service_account(ns, {"metadata": {"name": BUILDER_ACCOUNT}, **pulls})
    core.patch_namespaced_service_account(tenstorrent_demo.FLASHER_ACCOUNT, ns, pulls)
    rbac.create_cluster_role(
        {
            "metadata": {"name": BUILDER_ACCOUNT},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": BUILDER_ACCOUNT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": BUILDER_ACCOUNT,
            },
            "subjects": [{"kind": "ServiceAccount", "name": BUILDER_ACCOUNT, "namespace": ns}],
        }
    )
    return {
        "KMODKIT_TT_BUILDER_IMAGE": built["tenstorrent-builder"],
        "KMODKIT_TT_FLASHER_IMAGE": built["tenstorrent-flasher"],
        "KMODKIT_TT_SERVICE_ACCOUNT": BUILDER_ACCOUNT,
        "KMODKIT_TT_KMD_REPOSITORY": realnode.SOURCES_URL + REPOSITORY,
        # The real node has no NFD: policies cover nodes by their own selectors alone.
        "KMODKIT_TT_REQUIRE_PCI_LABEL": "false",
    }


def run(
    d: Any,
    step: Callable[[str], None],
    wait: Callable[[str, Callable[[], bool], float], None],
) -> None:
    """tt-kmd built and loaded on the real node, then its firmware flashed and read back."""
    selector = {realnode.NODE_LABEL: "true"}
    node = realnode.NODE_NAME

    def given_back_with(label: str, value: str) -> bool:
        """The node carries ``label=value`` and is schedulable again (the rollout is over)."""
        obj = d.core.read_node(node)
        return (obj.metadata.labels or {}).get(label) == value and not obj.spec.unschedulable

    step(
        f"the real node: a TenstorrentDriverPolicy over {node}; its builder pod clones "
        f"tt-kmd {KMD_VERSION} from the node's git mirror, builds it against the VM kernel's "
        "headers, caches and loads it, installs tt-smi and labels the node"
    )
    d.objs.create_cluster_custom_object(
        "driver.tenstorrent.com",
        "v1alpha1",
        "tenstorrentdriverpolicies",
        tenstorrent_demo.driver_policy("real-node", KMD_VERSION, selector),
    )
    wait(
        f"tt-kmd {KMD_VERSION} loaded on {node}",
        lambda: given_back_with(keys.TT_KMD_VERSION_LABEL, KMD_VERSION),
        TIMEOUT,
    )
    labels = f"{keys.TT_INSTALL_MODE_LABEL},{keys.TT_KMD_VERSION_LABEL},{keys.TT_SMI_VERSION_LABEL}"
    d.kubectl("get", "node", node, "-L", labels)

    step(
        f"the real node: a TenstorrentFirmwarePolicy; the flash Job downloads {BUNDLE} from "
        "the node's file server, flashes the (stand-in) device and reads it back with tt-smi"
    )
    d.objs.create_cluster_custom_object(
        "firmware.tenstorrent.com",
        "v1alpha1",
        "tenstorrentfirmwarepolicies",
        tenstorrent_demo.firmware_policy(
            "real-node-fw", FW_VERSION, selector, bundleURL=realnode.FILES_URL + BUNDLE
        ),
    )
    # The label names what the chips report once flashed: the bundle's 4-part version.
    wait(
        f"firmware {FW_VERSION} on {node}, the node given back",
        lambda: given_back_with(keys.TT_FW_VERSION_LABEL, f"{FW_VERSION}.0"),
        TIMEOUT,
    )

    def up_to_date() -> bool:
        policy = d.objs.get_cluster_custom_object(
            "firmware.tenstorrent.com", "v1alpha1", "tenstorrentfirmwarepolicies", "real-node-fw"
        )
        return ((policy.get("status") or {}).get("summary") or {}).get("upToDate") == 1

    # The policy's status follows in the pass after the node's release.
    wait(f"the policy reporting {node} up to date", up_to_date, 60.0)
    d.kubectl("get", "ttfwp", "real-node-fw")
    d.kubectl("get", "node", node, "-L", keys.TT_FW_VERSION_LABEL)
