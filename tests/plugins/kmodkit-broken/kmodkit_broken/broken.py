"""A backend whose dependency is not installed: importing it fails."""

import acme_npu_sdk  # type: ignore[import-not-found]  # deliberately absent

backend = acme_npu_sdk.backend
