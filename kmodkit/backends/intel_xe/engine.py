"""Which engine loads the driver: upstream KMM where it is installed, else kmodkit's own.

Both take the same Module body; only the apiVersion differs. The choice is
made on every pass from the API groups the apiserver serves, so installing or
removing KMM takes effect without restarting the operator. A policy
(``kernelModule.engine``) or the operator (``KMODKIT_INTEL_ENGINE``) can force
either engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kmodkit.backends.intel_xe import settings as keys
from kmodkit.backends.intel_xe.api import KernelModuleSpec
from kmodkit.sdk import KMM_API_VERSION, MODULE_API_VERSION

KMM_GROUP = "kmm.sigs.x-k8s.io"
KMM = "KMM"
BUILTIN = "Builtin"
API_VERSIONS = {KMM: KMM_API_VERSION, BUILTIN: MODULE_API_VERSION}
KMM_MISSING = "KMM is not installed in the cluster."


@dataclass(frozen=True)
class EngineChoice:
    engine: str | None
    """KMM or Builtin; None when the forced engine is not available."""
    error: str | None = None

    @property
    def api_version(self) -> str | None:
        return API_VERSIONS[self.engine] if self.engine else None


def choose_engine(
    km: KernelModuleSpec, api_groups: frozenset[str], settings: Mapping[str, str]
) -> EngineChoice:
    requested: str = km.engine
    note = None
    if requested == "Auto":
        setting = settings.get(keys.ENGINE, "auto").strip().lower()
        requested = {"kmm": KMM, "builtin": BUILTIN, "auto": "Auto", "": "Auto"}.get(setting, "")
        if not requested:
            note = f"{keys.ENGINE}={setting!r} is not one of auto, kmm, builtin; using auto"
            requested = "Auto"
    if requested == KMM and KMM_GROUP not in api_groups:
        return EngineChoice(None, KMM_MISSING)
    if requested == "Auto":
        requested = KMM if KMM_GROUP in api_groups else BUILTIN
    return EngineChoice(requested, note)
