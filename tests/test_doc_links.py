"""No link in the repository's Markdown leaves the repository: every relative link (or
backticked relative path with ``../``) resolves inside it to a file that exists, and every
URL is a loopback one (127.0.0.1, localhost) or a placeholder (``.invalid``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s)`'\"<>]+")
DOTDOT = re.compile(r"`(\.\./[^`\s]+)`")
LOCAL_HOSTS = re.compile(r"^(https?|unix|redis|spark)://(127\.0\.0\.1|localhost|/|\[::1\]|"
                         r"<|[^/]*\.invalid\b)")


def markdown_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    return [REPO / f for f in out if not f.startswith("e2e/toolchain/")]


def problems(path: Path, text: str) -> list[str]:
    found = []
    # a link is relative to its file; a backticked path, as the docs write them, to the
    # repository's root (`docs/protocol.md`)
    targets = [(t, path.parent) for t in LINK.findall(text)] + \
        [(t, REPO) for t in DOTDOT.findall(text)]
    for target, base in targets:
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        resolved = (base / target.split("#", 1)[0]).resolve()
        if not resolved.is_relative_to(REPO):
            found.append(f"{target}: outside the repository")
        elif not resolved.exists():
            found.append(f"{target}: no such file")
    found += [f"{url}: leaves the machine" for url in URL.findall(text)
              if not LOCAL_HOSTS.match(url)]
    return found


def test_markdown_files_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/design.md", "docs/protocol.md"} <= names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_link_leaves_the_repository(path: Path) -> None:
    assert problems(path, path.read_text()) == []


def test_the_scan_catches_links_that_leave() -> None:
    doc = REPO / "docs" / "x.md"
    text = ("see `../shared/DESIGN.md`, [a](../../elsewhere.md), [b](missing.md), "
            "[c](design.md), https://example.com/x and http://127.0.0.1:8470/v1")
    assert problems(doc, text) == [
        "../../elsewhere.md: outside the repository",
        "missing.md: no such file",
        "../shared/DESIGN.md: outside the repository",
        "https://example.com/x: leaves the machine",
    ]
