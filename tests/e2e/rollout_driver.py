"""A stand-alone rollout loop, as a backend's timer will run it, for the end-to-end tests.

Its hooks simulate a driver swap on kwok nodes: the "driver version" is a node
annotation, the swap sets it, and the swap also records (from the live cluster)
how many device-holding pods were still on the node at that moment and how many
times the node was really swapped. Run ``python -m tests.e2e.rollout_driver --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kmodkit.core.contract.hooks import Pending, Validated, Validation
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.rollout.reconcile import reconcile

VERSION = "e2e.kmodkit.io/driver-version"
SWAPS = "e2e.kmodkit.io/swaps"
DEVICE_PODS_AT_SWAP = "e2e.kmodkit.io/device-pods-at-swap"
DEVICE_PATH = "/dev/tenstorrent"


def holds_device(pod: Any) -> bool:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return any(
        str((v.get("hostPath") or {}).get("path", "")).startswith(DEVICE_PATH) for v in volumes
    )


def _raw(resp: Any) -> Any:
    return json.loads(resp.data)


class SimulatedDriverHooks:
    def __init__(self, core: client.CoreV1Api, target: str) -> None:
        self.core = core
        self.target = target

    def needs_update(self, node: Any) -> bool:
        return (node["metadata"].get("annotations") or {}).get(VERSION) != self.target

    def swap(self, node: Any) -> None:
        name = node["metadata"]["name"]
        fresh = _raw(self.core.read_node(name, _preload_content=False))
        annotations = fresh["metadata"].get("annotations") or {}
        if annotations.get(VERSION) == self.target:
            return
        pods = _raw(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name}", _preload_content=False
            )
        )["items"]
        holders = [
            p
            for p in pods
            if holds_device(p) and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]
        # Guarded by resourceVersion, so the count rises once per real swap even
        # if the process dies between this write and the rollout's own.
        self.core.patch_node(
            name,
            {
                "metadata": {
                    "resourceVersion": fresh["metadata"]["resourceVersion"],
                    "annotations": {
                        VERSION: self.target,
                        SWAPS: str(int(annotations.get(SWAPS, "0")) + 1),
                        DEVICE_PODS_AT_SWAP: str(len(holders)),
                    },
                }
            },
            _content_type="application/merge-patch+json",
        )

    def validate(self, node: Any) -> Validation:
        if (node["metadata"].get("annotations") or {}).get(VERSION) == self.target:
            return Validated()
        return Pending("driver not reloaded yet")

    def is_device_consumer(self, pod: Any) -> bool:
        return holds_device(pod)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--policy-id", required=True)
    parser.add_argument("--selector", required=True, help="label selector of the target nodes")
    parser.add_argument("--policy", default="{}", help="UpgradePolicy as JSON (camelCase)")
    parser.add_argument("--target", required=True)
    parser.add_argument("--skip-label")
    parser.add_argument("--involved", help="object reference (JSON) that also gets the events")
    parser.add_argument("--status-file", required=True)
    parser.add_argument("--interval", type=float, default=0.2)
    args = parser.parse_args()

    untyped_config: Any = config  # no type hints
    api = untyped_config.new_client_from_config(config_file=args.kubeconfig)
    core = client.CoreV1Api(api)
    policy = UpgradePolicy.model_validate_json(args.policy)
    hooks = SimulatedDriverHooks(core, args.target)
    status_file = Path(args.status_file)
    while True:
        try:
            nodes = _raw(core.list_node(label_selector=args.selector, _preload_content=False))
            status = reconcile(
                api,
                args.policy_id,
                policy,
                nodes["items"],
                hooks,
                target=args.target,
                skip_label=args.skip_label,
                involved=json.loads(args.involved) if args.involved else None,
            )
        except ApiException as err:
            print(f"pass failed: {err.reason}", flush=True)
        else:
            scratch = status_file.with_suffix(f".{os.getpid()}")
            scratch.write_text(json.dumps(status.to_wire()))
            scratch.replace(status_file)
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
