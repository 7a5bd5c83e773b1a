"""kmodkit: out-of-tree kernel drivers and device firmware on Kubernetes.

A backend imports ``kmodkit.sdk`` and nothing else of this package; every other
module is private and may move between releases.
"""
