"""kopf wiring: the operator, its two controllers, watch caches, kube client, plugins."""
