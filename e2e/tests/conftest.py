"""e2e tests run against the local control plane; the fixtures come from the plugin.

See kgroup_devcluster/pytest_plugin.py: `cluster`, `kube`, `crd`, `namespace`.
"""

pytest_plugins = ["kgroup_devcluster.pytest_plugin"]
