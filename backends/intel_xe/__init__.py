"""Intel Xe backend: the ClusterPolicy that installs the out-of-tree Xe driver."""

from core.backend import CONTRACT_VERSION, Backend

backend = Backend(
    name="intel_xe",
    version="0.1.0",
    contract=CONTRACT_VERSION,
    description="Intel Xe out-of-tree GPU driver through KMM Modules",
)
