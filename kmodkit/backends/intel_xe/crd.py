"""The ClusterPolicy CRD and the admission policy that goes with it.

CEL at the root of a CRD sees the policy's name but not the namespace the
operator runs in, and the Module a policy emits lives there: KMM's 41
characters are shared between ``<policy>-gpu`` and that namespace. The CRD
enforces the bound that holds for any namespace; the ValidatingAdmissionPolicy
below enforces the exact one, reading the namespace from the Namespace object
the operator's installation labels ``kmodkit.io/operator-namespace=true``.
"""

from __future__ import annotations

from typing import Any

from kmodkit.backends.intel_xe import api
from kmodkit.sdk import MAX_NAME_AND_NAMESPACE, CrdSource, PrinterColumn, cel

OPERATOR_NAMESPACE_LABEL = "kmodkit.io/operator-namespace"
"""On the operator's Namespace (value "true"): lets admission check policy names against it."""

CRD = CrdSource(
    group=api.GROUP,
    version=api.VERSION,
    kind=api.KIND,
    plural=api.PLURAL,
    namespaced=False,
    spec_model=api.ClusterPolicySpec,
    status_model=api.ClusterPolicyStatus,
    description=api.ClusterPolicy.__doc__ or "",
    printer_columns=(
        PrinterColumn("DP", "string", ".status.devicePluginStatus", "Device plugin pods ready"),
        PrinterColumn("DRA", "string", ".status.draStatus", "DRA driver pods ready"),
        PrinterColumn("XPU", "string", ".status.xpuManagerStatus", "XPU Manager pods ready"),
        PrinterColumn("KMM", "string", ".status.kmmStatus", "Nodes with the driver loaded"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
    ),
    root_rules=(
        cel(
            f"!has(self.metadata.name) || size(self.metadata.name) <= {api.MAX_NAME_LENGTH}",
            api.POLICY_NAME_LENGTH_MSG,
            subject="metadata.name",
        ),
    ),
)

_POLICY_NAME = f"{api.PLURAL}.{api.GROUP}-name-length"
_TOTAL = f"size(object.metadata.name) + {len(api.MODULE_SUFFIX)} + size(params.metadata.name)"


def admission_documents() -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and binding: policy name + operator namespace fit KMM's keys."""
    message = f"metadata.name: {api.POLICY_NAME_LENGTH_MSG}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": _POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "Namespace"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [api.GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE"],
                        "resources": [api.PLURAL],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"{_TOTAL} <= {MAX_NAME_AND_NAMESPACE}",
                    # Double-quoted CEL strings: the message has apostrophes.
                    "messageExpression": (
                        f'"{message} (the Module " + object.metadata.name + '
                        f'"{api.MODULE_SUFFIX} in namespace " + params.metadata.name + '
                        '" totals " + string(' + _TOTAL + ') + ")"'
                    ),
                    "reason": "Invalid",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": _POLICY_NAME},
        "spec": {
            "policyName": _POLICY_NAME,
            "validationActions": ["Deny"],
            "paramRef": {
                "selector": {"matchLabels": {OPERATOR_NAMESPACE_LABEL: "true"}},
                # Without a labelled namespace the CRD's bound and the
                # policy's status still catch the mistake.
                "parameterNotFoundAction": "Allow",
            },
        },
    }
    return [policy, binding]
