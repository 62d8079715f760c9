"""Each image installs what its code imports: every third-party module the operator's and
the sidecar's code can import (their package and the kgroup modules it reaches, imports
inside functions included) comes from a distribution the image's extra declares
(pyproject.toml), or that one of those requires. docker/*.Dockerfile installs
`.[operator]` and `.[sidecar]` and nothing else, so a module missing here is an
ImportError in the container only: the development environment has every extra.
Found by running the injector in the operator's image for the first time (cryptography
and jsonpatch were dev-only).
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("kgroup", "kgroup_operator", "kgroup_sidecar")
ROOTS = {"kgroup": REPO, "kgroup_operator": REPO / "operator",
         "kgroup_sidecar": REPO / "worker_sidecar"}


def _name(requirement: str) -> str:
    m = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert m, requirement
    return re.sub(r"[-_.]+", "-", m.group(0)).lower()


def _module_file(module: str) -> Path | None:
    top = module.split(".")[0]
    if top not in ROOTS:
        return None
    base = ROOTS[top].joinpath(*module.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.exists():
            return f
    return None


def _imports(f: Path) -> set[str]:
    """Absolute module names `f` imports (relative ones resolved)."""
    package = ".".join(f.relative_to(ROOTS[next(t for t in ROOTS if t in f.parts)])
                       .with_suffix("").parts)
    if f.name == "__init__.py":
        package = package.rsplit(".", 1)[0]
    parent = package if f.name == "__init__.py" else package.rsplit(".", 1)[0]
    out: set[str] = set()
    for n in ast.walk(ast.parse(f.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = parent.rsplit(".", n.level - 1)[0] if n.level > 1 else parent
                mod = f"{base}.{n.module}" if n.module else base
            else:
                mod = n.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in n.names}  # `from pkg import module`
    return out


def third_party_imports(package: str) -> dict[str, set[str]]:
    """Top-level third-party module -> the files importing it, over everything the
    package's modules reach through first-party imports."""
    todo = sorted(ROOTS[package].joinpath(package).rglob("*.py"))
    seen: set[Path] = set()
    found: dict[str, set[str]] = {}
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for mod in _imports(f):
            top = mod.split(".")[0]
            if top in FIRST_PARTY:
                parts = mod.split(".")
                for i in range(1, len(parts) + 1):  # the module and its packages
                    g = _module_file(".".join(parts[:i]))
                    if g is not None and g not in seen:
                        todo.append(g)
            elif top and top not in sys.stdlib_module_names:
                found.setdefault(top, set()).add(str(f.relative_to(REPO)))
    return found


def installed_by(extra: str) -> set[str]:
    """The distributions `pip install .[extra]` installs by name: the core's and the
    extra's requirements, and what those require in turn."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [_name(r) for r in project["dependencies"] + project["optional-dependencies"][extra]]
    out: set[str] = set()
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return out


@pytest.mark.parametrize(("package", "extra"), [("kgroup_operator", "operator"),
                                                ("kgroup_sidecar", "sidecar")])
def test_every_module_an_image_imports_is_installed_by_its_extra(package: str,
                                                                 extra: str) -> None:
    dists = md.packages_distributions()
    have = installed_by(extra)
    missing = {module: sorted(files) for module, files in third_party_imports(package).items()
               if not {_name(d) for d in dists.get(module, [module])} & have}
    assert not missing, (f"imported by {package}'s code but not installed by "
                         f"`.[{extra}]`: {missing}")


def test_the_check_sees_imports_inside_functions_and_through_kgroup() -> None:
    # the injector imports cryptography through kgroup_operator.certs, lazily from main
    found = third_party_imports("kgroup_operator")
    assert "cryptography" in found and "jsonpatch" in found
    assert "kgroup" not in found and "asyncio" not in found
    # a requirement's own requirements count (aiohttp brings yarl)
    assert "yarl" in installed_by("operator") and "kopf" not in installed_by("sidecar")
    # one client stack: the operator image holds no kubernetes client
    assert "kubernetes" not in installed_by("operator")
    assert "kubernetes" not in installed_by("sidecar")
