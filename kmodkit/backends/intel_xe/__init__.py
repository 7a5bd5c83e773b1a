"""Intel Xe backend: the ClusterPolicy that installs the out-of-tree Xe driver.

``intel.com/v1alpha1`` ClusterPolicy, the API of Intel's gpu-base-operator:
the device plugin or DRA driver, XPU Manager, the NFD rule, and, with
``spec.kernelModule``, the out-of-tree Xe driver as a Module for upstream KMM
or kmodkit's built-in engine.
"""

from kmodkit.backends.intel_xe import api
from kmodkit.backends.intel_xe.claims import CLAIMS
from kmodkit.backends.intel_xe.crd import CRD, admission_documents
from kmodkit.backends.intel_xe.deletion import hold_deletion
from kmodkit.backends.intel_xe.openshift import SCC_API_VERSION
from kmodkit.backends.intel_xe.plan import plan, with_apply_failures
from kmodkit.backends.intel_xe.rules import validate_cluster_policy
from kmodkit.backends.intel_xe.xpu_manager import ADMIN_NAMESPACES
from kmodkit.sdk import (
    CONTRACT_VERSION,
    KMM_API_VERSION,
    MODULE_API_VERSION,
    Backend,
    OwnedKind,
    Resource,
)

OWNS = (
    OwnedKind(KMM_API_VERSION, "Module", "modules"),
    OwnedKind(MODULE_API_VERSION, "Module", "modules"),
    OwnedKind("apps/v1", "DaemonSet", "daemonsets"),
    OwnedKind("v1", "ServiceAccount", "serviceaccounts"),
    OwnedKind("v1", "ConfigMap", "configmaps"),
    OwnedKind("v1", "Service", "services"),
    OwnedKind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    OwnedKind(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        namespaced=False,
    ),
    OwnedKind("resource.k8s.io/v1", "DeviceClass", "deviceclasses", namespaced=False),
    OwnedKind("resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates"),
    OwnedKind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        namespaced=False,
    ),
    OwnedKind(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        namespaced=False,
    ),
    OwnedKind("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureRule", "nodefeaturerules", namespaced=False),
    OwnedKind("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors"),
    OwnedKind(
        SCC_API_VERSION,
        "SecurityContextConstraints",
        "securitycontextconstraints",
        namespaced=False,
    ),
)

CLUSTER_POLICY = Resource(
    crd=CRD,
    model=api.ClusterPolicy,
    plan=plan,
    owns=OWNS,
    watches=(CLAIMS, ADMIN_NAMESPACES),
    extra_documents=admission_documents,
    validate=validate_cluster_policy,
    apply_failed=with_apply_failures,
    hold_deletion=hold_deletion,
)

backend = Backend(
    name="intel_xe",
    version="0.1.0",
    contract=CONTRACT_VERSION,
    description="Intel Xe out-of-tree GPU driver through KMM Modules",
    resources=(CLUSTER_POLICY,),
)
