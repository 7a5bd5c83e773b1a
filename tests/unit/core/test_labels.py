"""Label keys follow KMM's protocol exactly and parse back to the Module they name."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kmodkit.core import labels
from kmodkit.core.labels import LabelKeyError, ModuleKey, ModuleRef

ALL_FAMILIES = [labels.READY, labels.VERSION_READY, labels.MODULE_VERSION]
# The longest key upstream KMM derives from a Module (its version controller's);
# it is why KMM, and kmodkit, limit namespace plus name to 41 characters.
KMM_SCHEDULE_POD_VERSION = ModuleKey("beta.kmm.node.kubernetes.io", before="version-schedule-pod.")


@pytest.mark.parametrize(
    ("family", "key"),
    [
        (labels.READY, "kmm.node.kubernetes.io/drivers.xe.ready"),
        (labels.VERSION_READY, "kmm.node.kubernetes.io/drivers.xe.version.ready"),
        (labels.MODULE_VERSION, "kmm.node.kubernetes.io/version-module.drivers.xe"),
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
    assert labels.MODULE_NAME_LABEL == "kmm.node.kubernetes.io/module.name"
    assert labels.ROLE_LABEL == "kmm.node.kubernetes.io/role"
    assert labels.TARGET_KERNEL_LABEL == "kmm.node.kubernetes.io/target-kernel"


def test_the_longest_kmm_key_fits_exactly_at_41_characters() -> None:
    namespace, name = "n" * 20, "m" * 21
    key = KMM_SCHEDULE_POD_VERSION.key(namespace, name)
    assert len(key.split("/", 1)[1]) == 63
    with pytest.raises(LabelKeyError, match="longer than 63"):
        KMM_SCHEDULE_POD_VERSION.key(namespace, name + "m")


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
