"""A backend written for a contract this kmodkit does not speak yet."""

from core.backend import CONTRACT_VERSION, Backend

backend = Backend(name="future", version="9.0.0", contract=CONTRACT_VERSION + 1)
