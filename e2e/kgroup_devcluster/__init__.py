"""The local Kubernetes control plane for kgroup's tests and demos, and its test helpers.

Rule: nothing in this package talks to anything but 127.0.0.1. The control plane is
real (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built from their Go
modules), kwok plays the kubelet of three fake nodes, and one real node (containerd +
a kubelet, node.py) runs the pods that select it.

    python -m kgroup_devcluster up|down|status|env

    from kgroup_devcluster import ensure_up
    cluster = ensure_up()
    cluster.kubectl("get", "nodes")

Importing the package is cheap (no kubernetes client): the CLI uses it.
"""

from .cluster import Cluster, ClusterError, ensure_up, running, stop

__all__ = ["Cluster", "ClusterError", "ensure_up", "running", "stop"]
