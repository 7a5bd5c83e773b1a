"""kmodkit.sdk: the names a backend may use, held to the contract version.

Within one contract version names are only added; a backend written for it
keeps importing. Removing or renaming one means bumping CONTRACT_VERSION and
giving the new version its own list here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kmodkit import sdk

REPO = Path(__file__).resolve().parents[2]

NAMES_BY_CONTRACT = {
    1: frozenset(
        {
            "Backend", "BuildArg", "CONTRACT_VERSION", "ClusterView", "Condition", "CrdSource",
            "DEGRADED", "DeviceEviction", "Drain", "FIELD_MANAGER", "Failed", "HooksFn",
            "IMAGE_TAG_OR_DIGEST_CEL", "ImageRef", "ImageReferenceError", "KMM_API_VERSION",
            "KubeModel", "LABEL_VALUE_RE", "LabelKeyError", "LabelSelector",
            "LocalObjectReference", "MAX_NAME_AND_NAMESPACE", "MODULE_API_VERSION",
            "MODULE_NAME_RE", "MODULE_READY_LABEL", "NodeRolloutStatus", "NodeView", "Obj",
            "ObjectMeta", "ObjectName", "OwnedKind", "PROGRESSING", "Pending", "Plan", "PlanFn",
            "PrinterColumn", "Problem", "QUALIFIED_NAME_RE", "READY", "RegexpError",
            "RegistryTLS", "Resource", "RolloutHooks", "RolloutKeys", "RolloutRequest",
            "RolloutStatus", "RolloutStatusFn", "RolloutSummary", "ShortName", "State",
            "TEMPLATE_VARIABLES", "TOLERATION_EMPTY_KEY_MSG", "TOLERATION_EQUAL_VALUE_MSG",
            "TOLERATION_EXISTS_VALUE_MSG", "TOLERATION_KEY_MSG", "TOLERATION_SECONDS_MSG",
            "TemplateError", "Text", "Toleration", "UpgradePolicy", "Validated", "Validation",
            "WaitForCompletion", "Watch", "cel", "cel_rules", "check_re2", "check_template",
            "compile_re2", "controller_reference", "parse_image_reference", "parse_state",
            "require_tag_or_digest",
            "schema_problems", "selector_error", "substitute", "template_values",
        }
    ),
}  # fmt: skip


def test_every_name_of_the_contract_version_is_still_exported() -> None:
    assert sdk.CONTRACT_VERSION in NAMES_BY_CONTRACT, (
        f"contract v{sdk.CONTRACT_VERSION} has no name list in this test; add it"
    )
    missing = NAMES_BY_CONTRACT[sdk.CONTRACT_VERSION] - set(sdk.__all__)
    assert not missing, (
        f"kmodkit.sdk no longer exports {sorted(missing)}: backends written for contract "
        f"v{sdk.CONTRACT_VERSION} import them; keep them or bump CONTRACT_VERSION"
    )


def test_every_exported_name_exists() -> None:
    assert len(sdk.__all__) == len(set(sdk.__all__))
    assert [n for n in sdk.__all__ if not hasattr(sdk, n)] == []


def _sdk_imports(root: Path) -> set[str]:
    names = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "kmodkit.sdk":
                names |= {alias.name for alias in node.names}
    return names


def test_backends_use_only_exported_names() -> None:
    # The import contracts allow kmodkit.sdk; this holds them to its public names,
    # not to whatever else that module happens to have imported.
    for root in (REPO / "kmodkit" / "backends", REPO / "tests" / "plugins" / "kmodkit-example"):
        used = _sdk_imports(root)
        assert used, root
        assert used <= set(sdk.__all__), sorted(used - set(sdk.__all__))
