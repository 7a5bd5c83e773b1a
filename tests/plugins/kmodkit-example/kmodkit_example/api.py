"""``acme.example.com/v1alpha1`` AcmeDriver: the Acme NPU driver on a set of nodes.

The models are the single source of the CRD: ``kmodkit crds`` turns them into
a structural schema, and the plan reads objects through them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError

from kmodkit.sdk import (
    CrdSource,
    ImageRef,
    KubeModel,
    LabelSelector,
    ObjectMeta,
    PrinterColumn,
    Problem,
    ShortName,
    cel,
    schema_problems,
)

GROUP = "acme.example.com"
VERSION = "v1alpha1"
KIND = "AcmeDriver"
PLURAL = "acmedrivers"
API_VERSION = f"{GROUP}/{VERSION}"

MAX_NAME = 24
"""The Module is named ``acme-<name>`` and a Module's name and namespace share 41 characters."""


class AcmeDriverSpec(KubeModel):
    """Which nodes get the driver, and from which image."""

    image: ImageRef
    """Kernel-module image; ``${KERNEL_FULL_VERSION}`` is replaced by each node's kernel."""
    node_selector: LabelSelector = Field(default_factory=dict)
    """Nodes with these labels get the driver; empty selects every node."""
    module_name: ShortName = "acme_npu"
    """The kernel module to load."""
    image_pull_secret: ShortName | None = None
    """A pull secret for ``image``, in the operator's namespace."""


class AcmeDriverStatus(KubeModel):
    module: ShortName | None = None
    """``<namespace>/<name>`` of the Module that loads the driver."""
    ready_nodes: int | None = None
    """Nodes where the driver is loaded."""
    device_plugin_pods: int | None = None
    """Device-plugin pods that are ready (one per ready node)."""


class AcmeDriver(KubeModel):
    """The Acme NPU kernel driver and its device plugin."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: AcmeDriverSpec
    status: AcmeDriverStatus | None = None


CRD = CrdSource(
    group=GROUP,
    version=VERSION,
    kind=KIND,
    plural=PLURAL,
    spec_model=AcmeDriverSpec,
    status_model=AcmeDriverStatus,
    description=AcmeDriver.__doc__ or "",
    namespaced=False,
    printer_columns=(
        PrinterColumn("Ready", "integer", ".status.readyNodes"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
    ),
    root_rules=(
        cel(
            f"!has(self.metadata.name) || size(self.metadata.name) <= {MAX_NAME}",
            f"at most {MAX_NAME} characters",
            subject="metadata.name",
        ),
    ),
)


def validate(obj: Mapping[str, Any]) -> list[Problem]:
    """Offline checks for ``kmodkit validate``: the schema the CRD enforces."""
    try:
        AcmeDriver.model_validate(obj)
    except ValidationError as err:
        return schema_problems(err)
    return []
