"""Kernel strings and template values, as KMM defines them."""

from __future__ import annotations

import pytest

from kmodkit.core.kernel import dns_safe, node_kernel, normalize_for_tag, template_values


@pytest.mark.parametrize(
    ("reported", "kernel"),
    [
        ("6.8.0-45-generic", "6.8.0-45-generic"),
        ("5.15.0-1034-raspi+", "5.15.0-1034-raspi"),
        ("6.1.0++", "6.1.0+"),
        ("6.1.0+rt", "6.1.0+rt"),
    ],
)
def test_node_kernel_drops_one_trailing_plus(reported: str, kernel: str) -> None:
    assert node_kernel(reported) == kernel


@pytest.mark.parametrize(
    ("kernel", "tag"),
    [
        ("1.2.3+4", "1.2.3_4"),
        ("1.2.3 4", "1.2.3_4"),
        ("1.2.3&4", "1.2.3_4"),
        ("1.2.3%4", "1.2.3_4"),
        ("1.2.3?4", "1.2.3_4"),
        ("1.2.3-4", "1.2.3-4"),
        ("5.14.0-284.el9_2.x86_64", "5.14.0-284.el9_2.x86_64"),
    ],
)
def test_normalize_for_tag(kernel: str, tag: str) -> None:
    assert normalize_for_tag(kernel) == tag


def test_dns_safe() -> None:
    assert dns_safe("5.14.0-284.EL9_2.x86_64+") == "5-14-0-284-el9-2-x86-64"


def test_template_values_for_images_use_the_normalised_kernel() -> None:
    values = template_values("6.0.15-300.fc37+rt", name="xe", namespace="drv", for_tag=True)
    assert values.values == {
        "KERNEL_FULL_VERSION": "6.0.15-300.fc37_rt",
        "KERNEL_VERSION": "6.0.15-300.fc37_rt",
        "KERNEL_XYZ": "6.0.15",
        "KERNEL_X": "6",
        "KERNEL_Y": "0",
        "KERNEL_Z": "15",
        "MOD_NAME": "xe",
        "MOD_NAMESPACE": "drv",
    }
    assert values.unavailable == {}


def test_template_values_for_build_args_use_the_raw_kernel() -> None:
    values = template_values("6.0.15-300.fc37+rt", name="xe", namespace="drv", for_tag=False)
    assert values.values["KERNEL_FULL_VERSION"] == "6.0.15-300.fc37+rt"


def test_short_kernel_makes_components_unavailable_with_a_reason() -> None:
    values = template_values("6.8", name="xe", namespace="drv", for_tag=True)
    assert values.values["KERNEL_FULL_VERSION"] == "6.8"
    assert set(values.unavailable) == {"KERNEL_XYZ", "KERNEL_X", "KERNEL_Y", "KERNEL_Z"}
    assert "fewer than three components" in values.unavailable["KERNEL_Z"]
