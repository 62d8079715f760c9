"""The image cache's key: what each Dockerfile copies, what .dockerignore leaves out, and
which images a changed file rebuilds (pure functions of e2e/kgroup_devcluster/images.py;
the Dockerfiles and .dockerignore are the project's own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kgroup_devcluster.images import (
    IMAGES,
    base_images,
    copied_sources,
    ignore_rules,
    image_key,
    is_ignored,
    select_context,
)

REPO = Path(__file__).resolve().parents[1]
DOCKERIGNORE = (REPO / ".dockerignore").read_text()
DOCKERFILES = {i.name: (REPO / i.dockerfile).read_text() for i in IMAGES}

# A context listing shaped like the repository's (the real files' contents do not matter:
# the key sees each file through its digest).
CONTEXT = [
    "pyproject.toml", "constraints.txt", "README.md", ".dockerignore",
    "docker/operator.Dockerfile", "docker/sidecar.Dockerfile",
    "docker/pyspark-worker.Dockerfile",
    "kgroup/__init__.py", "kgroup/crd_models.py", "kgroup/core/locks.py",
    "kgroup/__pycache__/api.cpython-311.pyc",
    "operator/kgroup_operator/main.py", "worker_sidecar/kgroup_sidecar/main.py",
    "pipeline/kgroup_pipeline/worker.py", "pipeline/README.md",
    "e2e/kgroup_devcluster/cluster.py", "e2e/tests/test_images.py",
    "tests/test_image_keys.py", "docs/design.md", "charts/kgroup/values.yaml",
    "kgroup.egg-info/PKG-INFO", ".mypy_cache/3.11/x.json",
]


def keys(digests: dict[str, str], dockerfiles: dict[str, str] = DOCKERFILES) -> dict[str, str]:
    out = {}
    for name, text in dockerfiles.items():
        files = select_context(text, DOCKERIGNORE, CONTEXT)
        out[name] = image_key(text, {p: digests[p] for p in files}, "base-1")
    return out


def with_change(path: str) -> dict[str, str]:
    digests = dict.fromkeys(CONTEXT, "d0")
    digests[path] = "d1"
    return digests


@pytest.mark.parametrize(("changed", "rebuilt"), [
    ("kgroup/core/locks.py", {"operator", "sidecar", "worker"}),
    ("pyproject.toml", {"operator", "sidecar", "worker"}),
    ("constraints.txt", {"operator", "sidecar", "worker"}),
    ("operator/kgroup_operator/main.py", {"operator"}),
    ("worker_sidecar/kgroup_sidecar/main.py", {"sidecar"}),
    ("pipeline/kgroup_pipeline/worker.py", {"worker"}),
    ("pipeline/README.md", {"worker"}),
    ("e2e/kgroup_devcluster/cluster.py", set()),
    ("tests/test_image_keys.py", set()),
    ("docs/design.md", set()),
    ("kgroup/__pycache__/api.cpython-311.pyc", set()),  # .dockerignore: **/*.pyc
    ("kgroup.egg-info/PKG-INFO", set()),
])
def test_a_changed_file_changes_the_key_of_exactly_the_images_that_copy_it(
        changed: str, rebuilt: set[str]) -> None:
    before = keys(dict.fromkeys(CONTEXT, "d0"))
    after = keys(with_change(changed))
    assert {name for name in before if before[name] != after[name]} == rebuilt


def test_a_changed_dockerfile_or_base_changes_its_key() -> None:
    digests = dict.fromkeys(CONTEXT, "d0")
    before = keys(digests)
    edited = dict(DOCKERFILES, sidecar=DOCKERFILES["sidecar"] + "\nLABEL x=y\n")
    after = keys(digests, edited)
    assert {n for n in before if before[n] != after[n]} == {"sidecar"}
    text = DOCKERFILES["operator"]
    files = {p: "d0" for p in select_context(text, DOCKERIGNORE, CONTEXT)}
    assert image_key(text, files, "base-1") != image_key(text, files, "base-2")


def dev_cluster_sources(dockerfile: str) -> list[str]:
    """What a Dockerfile asks to copy from e2e/ (the dev-cluster code and its tests)."""
    return [s for s in copied_sources(dockerfile) if s == "e2e" or s.startswith("e2e/")]


def test_no_image_copies_the_dev_cluster_code_or_another_components_code() -> None:
    copied = {name: select_context(text, DOCKERIGNORE, CONTEXT)
              for name, text in DOCKERFILES.items()}
    for name, text in DOCKERFILES.items():
        assert dev_cluster_sources(text) == [], name
    assert not [f for f in copied["operator"]
                if f.startswith(("worker_sidecar/", "pipeline/"))]
    assert not [f for f in copied["sidecar"] if f.startswith(("operator/", "pipeline/"))]
    assert not [f for f in copied["worker"]
                if f.startswith(("operator/", "worker_sidecar/"))]


def test_the_checker_sees_a_dockerfile_that_copies_the_dev_cluster() -> None:
    # The broken variant of today's Dockerfiles: COPY e2e/kgroup_devcluster.
    broken = DOCKERFILES["operator"].replace(
        "COPY operator ./operator",
        "COPY operator ./operator\nCOPY e2e/kgroup_devcluster ./e2e/kgroup_devcluster")
    assert dev_cluster_sources(broken) == ["e2e/kgroup_devcluster"]


def test_every_dockerfile_builds_on_the_one_local_base() -> None:
    for text in DOCKERFILES.values():
        assert base_images(text) == ["python:3.11-slim-bookworm"]


def test_dockerfile_parsing_follows_continuations_flags_and_stages() -> None:
    text = """\
# syntax comment
FROM python:3.11-slim-bookworm AS build
COPY --chown=1:1 a.txt \\
     b/ ./dst/
COPY ["c d.txt", "/x/"]
FROM build
COPY --from=build /x /y
ADD e.tar /
"""
    assert copied_sources(text) == ["a.txt", "b", "c d.txt", "e.tar"]
    assert base_images(text) == ["python:3.11-slim-bookworm"]


@pytest.mark.parametrize(("path", "ignored"), [
    ("kgroup/__pycache__/api.cpython-311.pyc", True),
    ("__pycache__/x.pyc", True),
    ("kgroup/core/x.pyc", True),
    ("kgroup.egg-info/PKG-INFO", True),
    ("kgroup/sub.egg-info/PKG-INFO", False),  # Docker anchors patterns at the root
    ("e2e/kgroup_devcluster/cluster.py", True),
    ("kgroup/crd_models.py", False),
    ("docs", True),
])
def test_dockerignore_matches_like_docker(path: str, ignored: bool) -> None:
    assert is_ignored(path, ignore_rules(DOCKERIGNORE)) is ignored


def test_dockerignore_exceptions_win_when_they_come_last() -> None:
    rules = ignore_rules("docs\n!docs/keep.md\n**/*.md\n!README.md\n")
    assert is_ignored("docs/other.txt", rules)
    assert is_ignored("docs/keep.md", rules)  # **/*.md comes after the exception
    assert not is_ignored("README.md", rules)
    assert is_ignored("kgroup/notes.md", rules)
