"""The builder DaemonSet of a driver policy: one privileged pod per node builds and loads tt-kmd.

The update strategy is ``OnDelete``: a new template changes no pod by
itself. The operator decides when a node's pod is replaced: the rollout's swap
once the node is drained when tt-kmd must be reloaded, a budgeted restart when
it need not (``driver_changes``). A builder never reloads tt-kmd on its own: it
reloads only while its node's rollout state label (``TT_ROLLOUT_STATE_LABEL``)
says the rollout is swapping it, so a pod recreated by anyone else waits.

The pods mount the policy's control ConfigMap (``control_map``): ``paused``
reaches pods that already run without changing the template.

The ``template-hash`` annotation is a hash of the pod template with its keys
sorted (every list in the template is built in a fixed order), so the same
policy always hashes the same and an unchanged policy never looks stale.
``TT_FORCE_UNLOAD`` and ``TT_KMD_REPO`` are left out of the hash: switching
forceUnload changes how a pod unloads, and a new tt-kmd repository where a future
cache miss clones from, not what a node runs, so neither may roll the whole fleet
(pods started from then on have the new value). The
hash is taken over the template with the affinity of the policy's own selector
only: the terms that keep the builder off nodes older policies own
(``owned_affinity``) change with the other policies, and where a builder may
run is the DaemonSet controller's business, not a reason to restart (let alone
reload) the builders already running.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kmodkit.backends.tenstorrent import keys, names
from kmodkit.backends.tenstorrent.driver_api import TenstorrentDriverPolicySpec
from kmodkit.backends.tenstorrent.owned_affinity import (
    Term,
    own_requirements,
    render,
    required_affinity,
)
from kmodkit.backends.tenstorrent.settings import TenstorrentSettings
from kmodkit.sdk import RolloutKeys

APP_NAME = "tt-kmd-installer"
CONTAINER = "builder"
FORCE_UNLOAD_ENV = "TT_FORCE_UNLOAD"
REPOSITORY_ENV = "TT_KMD_REPO"
UNHASHED_ENV = frozenset({FORCE_UNLOAD_ENV, REPOSITORY_ENV})
VERSION_ENV = "TT_KMD_VERSION"
ROLLOUT_STATE_ENV = "TT_ROLLOUT_STATE_LABEL"
HOST_ROOT = "/host"
POLICY_DIR = "/run/tt-builder/policy"
"""Where the builder sees its policy's control ConfigMap (``paused``)."""
PAUSED_KEY = "paused"


def pod_labels(policy: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/component": "driver",
        keys.TT_DRIVER_POLICY_LABEL: names.label_value(policy),
    }


def template_hash(template: Mapping[str, Any]) -> str:
    """First 16 hex characters of SHA-256 over the template, keys sorted, ``UNHASHED_ENV`` left
    out."""
    spec = dict(template.get("spec") or {})
    containers = []
    for container in spec.get("containers") or []:
        env = [e for e in container.get("env") or [] if e.get("name") not in UNHASHED_ENV]
        containers.append({**container, "env": env})
    hashed = {**template, "spec": {**spec, "containers": containers}}
    text = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pod_template(
    policy: str, spec: TenstorrentDriverPolicySpec, settings: TenstorrentSettings
) -> dict[str, Any]:
    """The builder pod template, without the hash annotation."""
    env: list[dict[str, Any]] = [
        {"name": VERSION_ENV, "value": spec.version},
        {
            "name": FORCE_UNLOAD_ENV,
            "value": "true" if spec.upgrade_policy.force_unload else "false",
        },
        {
            "name": ROLLOUT_STATE_ENV,
            "value": RolloutKeys.for_policy(names.driver_policy_id(policy)).state,
        },
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "KMODKIT_HOST_ROOT", "value": HOST_ROOT},
        *settings.env(),
    ]
    if settings.kmd_repository:
        env.append({"name": REPOSITORY_ENV, "value": settings.kmd_repository})
    agent_status = [
        "kmodkit-agent",
        "--config",
        "/run/tt-builder/agent.yaml",
        "status",
        "--ready-if-host-managed",
    ]
    return {
        "metadata": {"labels": pod_labels(policy)},
        "spec": {
            "serviceAccountName": settings.service_account,
            # Holders of /dev/tenstorrent are found in /proc/*/fd of the host's
            # processes: named when the unload is refused, killed with forceUnload.
            "hostPID": True,
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "affinity": required_affinity(
                render(
                    [
                        own_requirements(
                            spec.selector(), keys.TT_DRIVER_SKIP_LABEL, settings.require_pci_label
                        )
                    ]
                )
            ),
            "terminationGracePeriodSeconds": 60,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": spec.installer.image or settings.builder_image,
                    "imagePullPolicy": spec.installer.image_pull_policy,
                    "command": ["/usr/local/bin/tt-builder"],
                    "env": env,
                    "securityContext": {"privileged": True},
                    # The builder writes why it stopped (the refusing holders, a
                    # failed build) here; the operator shows it in the status.
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "readinessProbe": {
                        "exec": {"command": agent_status},
                        "initialDelaySeconds": 5,
                        "periodSeconds": 10,
                        "timeoutSeconds": 5,
                        "failureThreshold": 3,
                    },
                    # The agent reaches the host through /host; the kernel's build tree
                    # and headers also sit at their own paths, because the build
                    # symlinks in /lib/modules/<kernel>/build are absolute host paths.
                    "volumeMounts": [
                        {
                            "name": "host",
                            "mountPath": HOST_ROOT,
                            "mountPropagation": "HostToContainer",
                        },
                        {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": True},
                        {"name": "usr-src", "mountPath": "/usr/src", "readOnly": True},
                        # A whole-volume mount (no subPath): the kubelet keeps it current.
                        {"name": "policy", "mountPath": POLICY_DIR, "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "host", "hostPath": {"path": "/", "type": "Directory"}},
                {"name": "lib-modules", "hostPath": {"path": "/lib/modules", "type": "Directory"}},
                {"name": "usr-src", "hostPath": {"path": "/usr/src", "type": "Directory"}},
                {"name": "policy", "configMap": {"name": names.daemonset_name(policy)}},
            ],
        },
    }


def daemonset(
    policy: str,
    namespace: str,
    spec: TenstorrentDriverPolicySpec,
    settings: TenstorrentSettings,
    terms: list[Term] | None = None,
) -> dict[str, Any]:
    """The builder DaemonSet; ``terms`` (the nodes the policy owns) replace the node selector
    terms of the policy's own selector, outside the hash."""
    template = pod_template(policy, spec, settings)
    digest = template_hash(template)
    template["metadata"]["annotations"] = {keys.TT_TEMPLATE_HASH_ANNOTATION: digest}
    if terms is not None:
        template["spec"]["affinity"] = required_affinity(terms)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": names.daemonset_name(policy),
            "namespace": namespace,
            "labels": pod_labels(policy),
            "annotations": {keys.TT_TEMPLATE_HASH_ANNOTATION: digest},
        },
        "spec": {
            "selector": {"matchLabels": pod_labels(policy)},
            "updateStrategy": {"type": "OnDelete"},
            "template": template,
        },
    }


def control_map(policy: str, namespace: str, paused: bool) -> dict[str, Any]:
    """The ConfigMap every builder pod of the policy reads ``paused`` from.

    Pausing must hold back pods that already run (a standby builder taking a
    vacated node over, a loader loading a removed driver again) without
    replacing them: one object the kubelets keep current in every pod, one
    write for the whole fleet. Named like the DaemonSet.
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.daemonset_name(policy),
            "namespace": namespace,
            "labels": pod_labels(policy),
        },
        "data": {PAUSED_KEY: "true" if paused else "false"},
    }
