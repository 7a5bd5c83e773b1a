"""The real operator as a subprocess, for integration tests (see devcluster.operator)."""

from devcluster.operator import Operator, running_operator

__all__ = ["Operator", "running_operator"]
