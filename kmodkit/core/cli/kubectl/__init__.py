"""``kubectl kmodkit``: the fleet at a glance, and the verbs admins otherwise type as labels.

``status`` reads the objects' status, which the operator keeps bounded, so it costs
the same on a 10-node and a 10,000-node cluster (except ``--node``, which reads one
node and its events). The verbs (``pause``, ``resume``, ``skip``, ``unskip``,
``retry``, ``upgrade``) each make one merge patch of what they change and print it.
"""

from kmodkit.core.cli.kubectl.commands import main

__all__ = ["main"]
