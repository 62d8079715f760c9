"""kgroup's sidecar: makes a worker pod's partition locks converge on its target.

Thin adapters around the pure core (``kgroup.core.member.converge``, which steps
``kgroup.core.member.reconcile``): the Kubernetes client (``kube``), the asyncio driver
(``runtime``), the local HTTP API (``http_api``).
See worker_sidecar/README.md for its settings, endpoints and audit file.
"""
