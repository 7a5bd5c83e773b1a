"""What the operator would create for a resource, computed offline.

The same pure plans the operator runs, fed with nodes from a file instead of
a watch: for a Module, the loader pod of every node it would load (with each
image taken to exist, or to be missing so the build Jobs show); for a
backend's resource, the objects its plan owns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kmodkit.core.api import API_VERSION, KMM_API_VERSION, Module
from kmodkit.core.contract.backend import ClusterView
from kmodkit.core.engine.build_plan import BuildSettings, plan_builds
from kmodkit.core.engine.loader_plan import ImageState, ImageStatus, plan
from kmodkit.core.engine.loader_pod import LoaderSettings
from kmodkit.core.engine.registry import Answer, Existence
from kmodkit.core.nodes import NodeView, node_view
from kmodkit.core.runtime.plugins import discover

MODULE_API_VERSIONS = (API_VERSION, KMM_API_VERSION)
# What every supported Kubernetes (1.34+) serves, for plans that look for an API.
OFFLINE_API_GROUPS = frozenset(
    {
        "apps",
        "batch",
        "policy",
        "rbac.authorization.k8s.io",
        "admissionregistration.k8s.io",
        "resource.k8s.io",
    }
)
# Placeholders for operator settings that only matter on a real cluster.
AGENT_IMAGE = "<agent image>"
BUILDER_IMAGE = "<builder image>"


class RenderError(ValueError):
    """A document render cannot handle; the message says what to do."""


def nodes_from(documents: Iterable[object]) -> list[NodeView]:
    """Nodes from Node objects, or from the items of a List of them."""
    nodes = []
    for doc in documents:
        if not isinstance(doc, Mapping):
            raise RenderError("--nodes holds a document that is not an object")
        items = doc.get("items") if doc.get("kind") == "List" else [doc]
        for item in items or []:
            if item.get("kind") != "Node":
                raise RenderError(f"--nodes holds a {item.get('kind')!r}; it takes Node objects")
            view = node_view(item)
            # A node without status (a hand-written file) counts as Ready.
            if not (item.get("status") or {}).get("conditions"):
                view = NodeView(
                    view.name,
                    view.labels,
                    view.kernel,
                    view.arch or "amd64",
                    True,
                    view.unschedulable,
                    view.boot_id,
                    view.taints,
                    view.uid,
                )
            nodes.append(view)
    return nodes


def render_module(
    module: Module, nodes: Sequence[NodeView], images_missing: bool = False
) -> list[dict[str, Any]]:
    """Build Jobs (when images are taken as missing) and loader pods for ``module``."""
    loader = LoaderSettings(agent_image=AGENT_IMAGE)
    first = plan(module, nodes, [], {}, loader)
    if not images_missing:
        states = {i: ImageStatus(ImageState.EXISTS) for i in first.needed_images}
        return list(plan(module, nodes, [], states, loader).create)
    answers = {i: Answer(Existence.MISSING) for i in first.needed_images}
    builds = plan_builds(
        module,
        first.needed_images,
        first.nodes_by_image,
        nodes,
        answers,
        [],
        # No cluster to read the Dockerfile ConfigMap from: the Job mounts it by
        # name all the same; only its inputs digest is of an empty Dockerfile.
        lambda _config_map: "",
        BuildSettings(builder_image=BUILDER_IMAGE),
        now=0.0,
    )
    return list(builds.create)


def render(
    obj: object,
    nodes: Sequence[NodeView],
    operator_namespace: str,
    images_missing: bool = False,
) -> list[dict[str, Any]]:
    if not isinstance(obj, Mapping):
        raise RenderError("a document is not an object; render takes Kubernetes objects")
    if obj.get("apiVersion") in MODULE_API_VERSIONS and obj.get("kind") == "Module":
        return render_module(Module.model_validate(obj), nodes, images_missing)
    for found in discover():
        for resource in found.backend.resources if found.backend else ():
            if (resource.api_version, resource.crd.kind) == (
                obj.get("apiVersion"),
                obj.get("kind"),
            ):
                view = ClusterView(
                    nodes=nodes,
                    api_groups=OFFLINE_API_GROUPS,
                    operator_namespace=operator_namespace,
                    watched={},
                )
                return [dict(o) for o in resource.plan(obj, view).objects]
    raise RenderError(
        f"no installed backend serves {obj.get('apiVersion')} {obj.get('kind')}; "
        "`kmodkit backends` lists what is installed"
    )
