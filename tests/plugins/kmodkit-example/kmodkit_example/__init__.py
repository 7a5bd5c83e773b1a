"""An out-of-tree kmodkit backend for the (made-up) Acme NPU.

Installed next to kmodkit, it is found through the ``kmodkit.backends`` entry
point in its pyproject.toml; ``kmodkit crds`` then prints its CRD and
``kmodkit run`` serves it. See docs/writing-a-backend.md.
"""

from kmodkit.sdk import MODULE_API_VERSION, Backend, OwnedKind, Resource
from kmodkit_example.api import CRD, AcmeDriver, validate
from kmodkit_example.plan import plan

backend = Backend(
    name="example",
    version="0.1.0",
    # The version this code was written for, as a literal: kmodkit's own
    # CONTRACT_VERSION would always equal the running kmodkit's and defeat the check.
    contract=1,
    description="Acme NPU driver and device plugin (example out-of-tree backend)",
    resources=(
        Resource(
            crd=CRD,
            model=AcmeDriver,
            plan=plan,
            owns=(
                OwnedKind(MODULE_API_VERSION, "Module", "modules"),
                OwnedKind("apps/v1", "DaemonSet", "daemonsets"),
            ),
            validate=validate,
        ),
    ),
)
