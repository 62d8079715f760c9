"""Hypothesis profiles for every test tier, loaded as a pytest plugin (pyproject.toml
``addopts``: ``-p kgroup_testing.hypothesis_profiles``).

Under CI (the environment variable ``CI`` set, as `.ci/run` is run) every property test
draws a fixed set of examples (``derandomize``): CI judges a submission by what it
changed, not by which random examples it drew that day. Everywhere else (`make test`,
`make check` on a developer's machine) the examples are random, so new counterexamples
keep turning up where they can be fixed; each one found is pinned by a unit test.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
