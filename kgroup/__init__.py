"""kgroup: Kubernetes-native consumer groups.

``__version__`` is the release this tree is. Its one source is ``pyproject.toml``'s
``[project] version``; this copy, the chart's ``version``/``appVersion`` and CHANGELOG.md's
newest release are checked against it by ``tests/test_version.py`` (a literal here, not
``importlib.metadata``: that costs every process 1.5 MB and tens of milliseconds to import,
and a sidecar's memory is counted). The operator and the sidecar log it when they start
and export it as ``kgroup_build_info{component,version}``.
"""

__version__ = "0.1.0"
