"""A Service and ServiceMonitor for XPU Manager's metrics (prometheusIntegration)."""

from __future__ import annotations

from typing import Any

from kmodkit.backends.intel_xe import xpu_manager
from kmodkit.backends.intel_xe.operand import Operands

MONITORING_GROUP = "monitoring.coreos.com"


def name(policy: str) -> str:
    return f"{policy}-xpu-manager-metrics"


def manifests(ops: Operands) -> list[dict[str, Any]]:
    labels = ops.labels(xpu_manager.APP)
    n = name(ops.policy)
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": n, "namespace": ops.namespace, "labels": labels},
            "spec": {
                "selector": labels,
                "ports": [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": f"{MONITORING_GROUP}/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": n, "namespace": ops.namespace, "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "namespaceSelector": {"matchNames": [ops.namespace]},
                "endpoints": [{"port": "http", "path": "/metrics", "interval": "5s"}],
            },
        },
    ]
