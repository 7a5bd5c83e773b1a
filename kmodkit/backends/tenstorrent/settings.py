"""The operator-wide Tenstorrent settings, read from the operator's ``KMODKIT_*`` environment.

- ``KMODKIT_TT_BUILDER_IMAGE``: builder image (tt-kmd toolchain, tt-smi, agent).
- ``KMODKIT_TT_FLASHER_IMAGE``: flash Job image (tt-flash, tt-smi).
- ``KMODKIT_TT_SERVICE_ACCOUNT``: service account of the builder pods
  (default ``kmodkit-tenstorrent``).
- ``KMODKIT_TT_FLASHER_SERVICE_ACCOUNT``: service account of the flash pods, bound to no role
  (default ``kmodkit-tenstorrent-flasher``).
- ``KMODKIT_TT_DEPLOY_GATES``: comma-separated gate label keys, set to ``false`` while a
  node is drained (default ``tenstorrent.com/deploy.tt-telemetry``; set but empty: none).
- ``KMODKIT_TT_KMD_REPOSITORY``: the git repository the builders clone tt-kmd from on a
  cache miss (tag ``ttkmd-<version>``); default: the builder image's, upstream's on GitHub.
  An air-gapped cluster names its mirror here.
- ``KMODKIT_TT_REQUIRE_PCI_LABEL``: ``false`` lets policies cover nodes without the NFD
  Tenstorrent PCI label (default ``true``).
- ``KMODKIT_EXTRA_ENV_<NAME>``: ``<NAME>=<value>`` is set in the builder and flash pods
  (the chart's ``controller.extraEnv``: ``HTTPS_PROXY``, ``NO_PROXY``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_BUILDER_IMAGE = "ghcr.io/kmodkit/tenstorrent-builder:0.1.0"
DEFAULT_FLASHER_IMAGE = "ghcr.io/kmodkit/tenstorrent-flasher:0.1.0"
DEFAULT_SERVICE_ACCOUNT = "kmodkit-tenstorrent"
DEFAULT_FLASHER_SERVICE_ACCOUNT = "kmodkit-tenstorrent-flasher"
DEFAULT_DEPLOY_GATES = ("tenstorrent.com/deploy.tt-telemetry",)
EXTRA_ENV_PREFIX = "KMODKIT_EXTRA_ENV_"


@dataclass(frozen=True)
class TenstorrentSettings:
    builder_image: str = DEFAULT_BUILDER_IMAGE
    flasher_image: str = DEFAULT_FLASHER_IMAGE
    service_account: str = DEFAULT_SERVICE_ACCOUNT
    flasher_service_account: str = DEFAULT_FLASHER_SERVICE_ACCOUNT
    deploy_gates: tuple[str, ...] = DEFAULT_DEPLOY_GATES
    require_pci_label: bool = True
    kmd_repository: str = ""
    extra_env: tuple[tuple[str, str], ...] = ()
    """(name, value) pairs for the pods, sorted by name so the pod template is stable."""

    @classmethod
    def from_settings(cls, env: Mapping[str, str]) -> TenstorrentSettings:
        gates = env.get("KMODKIT_TT_DEPLOY_GATES")
        return cls(
            builder_image=env.get("KMODKIT_TT_BUILDER_IMAGE") or DEFAULT_BUILDER_IMAGE,
            flasher_image=env.get("KMODKIT_TT_FLASHER_IMAGE") or DEFAULT_FLASHER_IMAGE,
            service_account=env.get("KMODKIT_TT_SERVICE_ACCOUNT") or DEFAULT_SERVICE_ACCOUNT,
            flasher_service_account=env.get("KMODKIT_TT_FLASHER_SERVICE_ACCOUNT")
            or DEFAULT_FLASHER_SERVICE_ACCOUNT,
            deploy_gates=DEFAULT_DEPLOY_GATES
            if gates is None
            else tuple(g.strip() for g in gates.split(",") if g.strip()),
            require_pci_label=env.get("KMODKIT_TT_REQUIRE_PCI_LABEL", "true").lower() != "false",
            kmd_repository=env.get("KMODKIT_TT_KMD_REPOSITORY", "").strip(),
            extra_env=tuple(
                sorted(
                    (key[len(EXTRA_ENV_PREFIX) :], value)
                    for key, value in env.items()
                    if key.startswith(EXTRA_ENV_PREFIX)
                    and value
                    and len(key) > len(EXTRA_ENV_PREFIX)
                )
            ),
        )

    def env(self) -> list[dict[str, str]]:
        return [{"name": name, "value": value} for name, value in self.extra_env]
