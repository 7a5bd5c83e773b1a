"""Tenstorrent backend: tt-kmd, tt-smi and firmware rolled across the fleet."""

from core.backend import CONTRACT_VERSION, Backend

backend = Backend(
    name="tenstorrent",
    version="0.1.0",
    contract=CONTRACT_VERSION,
    description="Tenstorrent tt-kmd driver, tt-smi and firmware",
)
