"""Label keys follow KMM's protocol exactly and parse back to the Module they name."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kmodkit.core import labels
from kmodkit.core.labels import LabelKeyError, ModuleKey, ModuleRef

ALL_FAMILIES = [
    labels.READY,
    labels.VERSION_READY,
    labels.DEVICE_PLUGIN_READY,
    labels.DRA_READY,
    labels.DEVICE_PLUGIN_TARGET,
    labels.MODULE_VERSION,
    labels.WORKER_POD_VERSION,
    labels.SCHEDULE_POD_VERSION,
    labels.MODULE_CONFIGURED,
    labels.MODULE_IN_USE,
]


@pytest.mark.parametrize(
    ("family", "key"),
    [
        (labels.READY, "kmm.node.kubernetes.io/drivers.xe.ready"),
        (labels.VERSION_READY, "kmm.node.kubernetes.io/drivers.xe.version.ready"),
        (labels.DEVICE_PLUGIN_READY, "kmm.node.kubernetes.io/drivers.xe.device-plugin-ready"),
        (labels.DRA_READY, "kmm.node.kubernetes.io/drivers.xe.dra-ready"),
        (labels.DEVICE_PLUGIN_TARGET, "kmm.node.kubernetes.io/drivers.xe.device-plugin-target"),
        (labels.MODULE_VERSION, "kmm.node.kubernetes.io/version-module.drivers.xe"),
        (labels.WORKER_POD_VERSION, "beta.kmm.node.kubernetes.io/version-worker-pod.drivers.xe"),
        (
            labels.SCHEDULE_POD_VERSION,
            "beta.kmm.node.kubernetes.io/version-schedule-pod.drivers.xe",
        ),
        (labels.MODULE_CONFIGURED, "beta.kmm.node.kubernetes.io/drivers.xe.module-configured"),
        (labels.MODULE_IN_USE, "beta.kmm.node.kubernetes.io/drivers.xe.module-in-use"),
    ],
)
def test_kmm_key_formats(family: ModuleKey, key: str) -> None:
    assert family.key("drivers", "xe") == key
    assert family.parse(key) == ModuleRef("drivers", "xe")


def test_names_with_dots_parse_correctly() -> None:
    key = labels.MODULE_VERSION.key("drivers", "intel.xe")
    assert labels.MODULE_VERSION.parse(key) == ModuleRef("drivers", "intel.xe")


def test_ready_family_does_not_claim_version_ready_keys() -> None:
    key = labels.VERSION_READY.key("drivers", "xe")
    assert labels.READY.parse(key) is None
    assert labels.VERSION_READY.parse(key) == ModuleRef("drivers", "xe")


@pytest.mark.parametrize(
    "key",
    [
        "kmm.node.kubernetes.io/xe.ready.extra",
        "kmm.node.kubernetes.io/Drivers.xe.ready",
        "kmm.node.kubernetes.io/drivers..ready",
        "kmm.node.kubernetes.io/drivers.ready",
        "example.com/drivers.xe.ready",
        "kmm.node.kubernetes.io/version-module.drivers",
    ],
)
def test_foreign_keys_are_not_parsed(key: str) -> None:
    assert all(family.parse(key) is None for family in ALL_FAMILIES)


def test_constants_match_kmm() -> None:
    assert labels.deprecated_ready_label("xe") == "kmm.node.kubernetes.io/xe.ready"
    assert labels.NAMESPACE_CONTAINS_MODULES_LABEL == "kmm.node.k8s.io/contains-modules"
    assert labels.MODULE_NAME_LABEL == "kmm.node.kubernetes.io/module.name"
    assert labels.KMM_MODULE_FINALIZER == "kmm.node.kubernetes.io/module-finalizer"
    assert labels.WORKER_POD_FINALIZER == "kmm.node.kubernetes.io/nodemodulesconfig-reconciler"


def test_the_longest_kmm_key_fits_exactly_at_41_characters() -> None:
    namespace, name = "n" * 20, "m" * 21
    key = labels.SCHEDULE_POD_VERSION.key(namespace, name)
    assert len(key.split("/", 1)[1]) == 63
    with pytest.raises(LabelKeyError, match="longer than 63"):
        labels.SCHEDULE_POD_VERSION.key(namespace, name + "m")


def test_kmodkit_keys() -> None:
    family = labels.kmodkit_module_key(".rollout-state")
    assert family.key("drivers", "xe") == "kmodkit.io/drivers.xe.rollout-state"
    assert family.parse("kmodkit.io/drivers.xe.rollout-state") == ModuleRef("drivers", "xe")
    with pytest.raises(LabelKeyError):
        labels.kmodkit_module_key("." + "x" * 21)


_label = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?\Z")


@given(
    namespace=_label,
    name=st.lists(_label, min_size=1, max_size=3).map(".".join),
    family=st.sampled_from(ALL_FAMILIES),
)
def test_keys_round_trip(namespace: str, name: str, family: ModuleKey) -> None:
    assume(len(namespace) + len(name) <= 41)
    # "<name>.version" + ".ready" reads as a version-ready key; KMM has the
    # same ambiguity and resolves it the same way.
    assume(not (family is labels.READY and name.endswith(".version")))
    assert family.parse(family.key(namespace, name)) == ModuleRef(namespace, name)
