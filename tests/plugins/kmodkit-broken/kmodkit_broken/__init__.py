"""A backend written for a contract this kmodkit does not speak yet."""

from kmodkit.core.contract.backend import CONTRACT_VERSION, Backend

backend = Backend(name="future", version="9.0.0", contract=CONTRACT_VERSION + 1)
