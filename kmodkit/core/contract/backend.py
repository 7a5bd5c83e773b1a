"""The contract between kmodkit's runtime and a backend plugin.

A backend is a plain object registered under the entry-point group
``kmodkit.backends``. It declares its custom resources; for each one a *pure*
``plan`` turns an object (and what the runtime observed of the cluster) into
the objects to own and the status to report. The runtime does the rest the
same way for every backend, built-in or third-party: watches, server-side
apply of the owned objects, pruning what is no longer planned, status writes,
and, when the plan asks for one, a node-by-node rollout on
``kmodkit.core.rollout`` driven by the backend's hooks.

The contract is versioned: a backend declares the ``CONTRACT_VERSION`` it was
written for and the runtime refuses any other, naming both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import click
from pydantic import BaseModel

from kmodkit.core.contract.fields import Tree, cut, field_tree
from kmodkit.core.contract.hooks import Obj, RolloutHooks
from kmodkit.core.contract.policy import UpgradePolicy
from kmodkit.core.nodes import NodeView
from kmodkit.core.schema.crd import CrdSource
from kmodkit.core.schema.validation import Problem

ENTRY_POINT_GROUP = "kmodkit.backends"

# Bumped on any incompatible change to the classes below.
CONTRACT_VERSION = 1


@dataclass(frozen=True)
class Watch:
    """Objects of another kind a plan needs to see (e.g. ResourceClaims, Modules)."""

    name: str
    """Key of these objects in ``ClusterView.watched``."""
    group: str
    version: str
    plural: str
    labels: Mapping[str, str] = field(default_factory=dict)
    """Only objects with these labels are watched (keep watches narrow at scale)."""
    wakes: bool = True
    """Whether a change to one of these objects re-plans every object of the resource. False
    for objects read only as context whose changes other events (or the plan's requeue) follow:
    a DaemonSet's status changes with every pod it runs."""
    fields: tuple[str, ...] = ()
    """The fields the plan and hooks read (``kmodkit.core.contract.fields`` paths, e.g.
    ``spec.nodeName``, ``status.containerStatuses[].state``): the cache keeps only these, and
    a change to no other field wakes nothing. Empty keeps each object whole, less
    ``metadata.managedFields``. Name them for fleet-sized kinds: a pod kept whole costs the
    operator kilobytes, on every node. A third party's plan tests may read their fixtures
    through ``kept`` to see what the plan will see."""
    field_selector: str = ""
    """A server-side field selector besides the labels (e.g. ``status.phase!=Succeeded`` for
    pods): an object that stops matching leaves the cache as if deleted. For objects that stay
    long after the plan stops reading them (a finished Job's pod, kept a day). Last, so that
    the fields before it keep their positions."""

    def __post_init__(self) -> None:
        self._tree  # noqa: B018 -- a bad path is refused when the backend is loaded

    @cached_property
    def _tree(self) -> Tree:
        return field_tree(self.fields)

    def kept(self, obj: Obj) -> Obj:
        """The fields of ``obj`` the cache keeps (all when none are named)."""
        return cut(obj, self._tree) if self.fields else obj


@dataclass(frozen=True)
class OwnedKind:
    """A kind of object a plan may return; stale ones of this kind are pruned."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True


@dataclass(frozen=True)
class ClusterView:
    """What the runtime observed, handed to every plan."""

    nodes: Sequence[NodeView]
    api_groups: frozenset[str]
    """API groups the apiserver serves (e.g. to detect upstream KMM)."""
    operator_namespace: str
    watched: Mapping[str, Sequence[Obj]]
    owned: Sequence[Obj] = ()
    """Objects this resource's object owns right now (any OwnedKind)."""
    settings: Mapping[str, str] = field(default_factory=dict)
    """Operator configuration given to backends (images, proxy variables, gates)."""


@dataclass(frozen=True)
class RolloutRequest:
    """Ask the runtime to run (one pass of) a node-by-node rollout."""

    policy_id: str
    """Stable and unique per rollout, e.g. ``ttdp/<name>``; scopes the node keys."""
    policy: UpgradePolicy
    nodes: Sequence[str]
    """The nodes the rollout covers."""
    target: str
    """What is being delivered (a version); a failed node is retried when it changes."""
    paused: bool = False
    skip_label: str | None = None


@dataclass(frozen=True)
class RolloutControls:
    """How an admin steers a resource's rollouts by hand (``kubectl kmodkit``).

    The same facts a plan puts in its ``RolloutRequest``, declared up front so a
    client can act on an object without running the plan.
    """

    policy_id: Callable[[str], str]
    """The rollout id of the object with this name, as its plan's ``RolloutRequest`` has it."""
    pause_field: str | None = None
    """The boolean ``spec`` field the plan passes as ``paused`` (None: cannot be paused)."""
    skip_label: str | None = None
    """The plan's ``skip_label``: ``"true"`` on a node takes it out of every such rollout."""


@dataclass(frozen=True)
class NodeEvent:
    """Something that happened to one node, posted on the node and on the object."""

    node: str
    reason: str
    """A CamelCase code, as the node's status entry has it."""
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Plan:
    objects: Sequence[Obj] = ()
    """Complete manifests of every object to own; the runtime adds the owner link."""
    status: Mapping[str, Any] = field(default_factory=dict)
    requeue_after: float | None = None
    """Seconds until the plan should run again even if nothing changes."""
    rollout: RolloutRequest | None = None
    events: Sequence[NodeEvent] = ()
    """Node transitions the plan saw and a rollout does not report (it posts its own)."""


@dataclass(frozen=True)
class ApplyFailure:
    """A planned object the API server refused to apply, with the server's own message."""

    api_version: str
    kind: str
    namespace: str
    name: str
    message: str


PlanFn = Callable[[Obj, ClusterView], Plan]
DeletionGuardFn = Callable[[Obj, ClusterView, Any], Mapping[str, Any] | None]
"""The status to show while an object's deletion must wait (the third argument is a
kubernetes ApiClient), or None to let it go; the runtime asks again every 10 s."""
ApplyFailedFn = Callable[[Obj, Mapping[str, Any], Sequence[ApplyFailure]], Mapping[str, Any]]
"""Fold the writes the API server refused this pass into the plan's status (given the
object, the plan's status and the refusals); the runtime writes what it returns."""
HooksFn = Callable[[Obj, ClusterView, Any], RolloutHooks]
"""Build the rollout hooks for an object; the third argument is a kubernetes ApiClient."""
RolloutStatusFn = Callable[[Mapping[str, Any], Any], Mapping[str, Any]]
"""Merge a ``kmodkit.sdk.RolloutStatus`` into the plan's status."""
NodeLabelsFn = Callable[[Obj, Mapping[str, Sequence[Obj]]], Callable[[str], bool]]
"""Which node label keys an object's plan and hooks read, given the object and what the
resource's watches hold (as ``ClusterView.watched``): a predicate on the key."""


@dataclass(frozen=True)
class Resource:
    """One custom resource a backend serves."""

    crd: CrdSource
    model: type[BaseModel]
    """The whole object (apiVersion, kind, metadata, spec, status), for validation."""
    plan: PlanFn
    owns: tuple[OwnedKind, ...] = ()
    watches: tuple[Watch, ...] = ()
    hooks: HooksFn | None = None
    """Required when ``plan`` may return a RolloutRequest."""
    rollout_status: RolloutStatusFn | None = None
    extra_documents: Callable[[], list[dict[str, Any]]] | None = None
    """More manifests installed with the CRD (admission policies, DeviceClasses)."""
    validate: Callable[[Obj], list[Problem]] | None = None
    """Offline checks of a whole object (``kmodkit validate``): the CRD's rules and more."""
    apply_failed: ApplyFailedFn | None = None
    """How refused writes show in the status; without it they are only Events and logs."""
    hold_deletion: DeletionGuardFn | None = None
    """Keeps a finalizer on every object while it says the deletion must wait."""
    controls: RolloutControls | None = None
    """Declared when ``plan`` may return a RolloutRequest, for ``kubectl kmodkit``'s verbs."""
    node_labels: NodeLabelsFn | None = None
    """Which node labels the plan and hooks read (every selector's keys, the backend's own
    labels): a node change that moves only other labels (another controller's) wakes none of
    this resource's passes. Any other change of a node (added, removed, its kernel, readiness,
    taints, schedulability) wakes them, and so do the rollout's own labels. None: every node
    change wakes them. A key read but not named leaves a node waiting for the resync."""

    @property
    def api_version(self) -> str:
        return f"{self.crd.group}/{self.crd.version}"


@dataclass(frozen=True)
class Backend:
    """What a backend declares to the runtime (docs/writing-a-backend.md)."""

    name: str
    """The entry point's name, which configuration and health use."""
    version: str
    contract: int
    """The contract version the backend was written for, as a literal in third-party code:
    importing ``CONTRACT_VERSION`` would always match the running kmodkit's."""
    description: str = ""
    resources: tuple[Resource, ...] = field(default=())
    commands: tuple[click.Command, ...] = field(default=())
    """Extra ``kmodkit`` subcommands (e.g. a node migration helper), added to the CLI."""
