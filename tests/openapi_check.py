"""Check answers of the sidecar's HTTP API against its OpenAPI document
(worker_sidecar/kgroup_sidecar/openapi.yaml): the (path, method, status) is documented,
and a JSON body matches the documented schema (jsonschema, OpenAPI 3.1 = JSON Schema
2020-12). Used by tests/test_sidecar_openapi.py and e2e/tests/test_sidecar_openapi_process.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

DOC_FILE = (Path(__file__).resolve().parents[1] / "worker_sidecar" / "kgroup_sidecar"
            / "openapi.yaml")


def load() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(DOC_FILE.read_text())
    return doc


def template_of(doc: dict[str, Any], path: str) -> str:
    """The documented path template that ``path`` (query string stripped) matches."""
    bare = path.split("?", 1)[0]
    for template in doc["paths"]:
        pattern = "^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, bare):
            return str(template)
    raise AssertionError(f"{bare} is not in the OpenAPI document")


class Checker:
    def __init__(self) -> None:
        self.doc = load()
        self.registry: Registry[Any] = Registry().with_resource(
            "urn:sidecar", DRAFT202012.create_resource(self.doc))
        self.seen: set[tuple[str, str, str]] = set()

    def check(self, method: str, path: str, status: int, content_type: str,
              body: str) -> None:
        template = template_of(self.doc, path)
        operation = self.doc["paths"][template].get(method.lower())
        assert operation is not None, f"{method} {template} is not documented"
        response = operation["responses"].get(str(status))
        assert response is not None, f"{method} {template} answered {status}: undocumented"
        media = content_type.split(";")[0].strip()
        assert media in response["content"], f"{method} {template} {status}: {media}"
        schema = response["content"][media]["schema"]
        if media == "application/json":
            if "$ref" in schema:
                schema = {"$ref": "urn:sidecar" + schema["$ref"]}
            validator = Draft202012Validator(schema, registry=self.registry)
            errors = sorted(str(e.message) for e in validator.iter_errors(json.loads(body)))
            assert not errors, f"{method} {template} {status}: {errors} in {body[:300]}"
        self.seen.add((method.upper(), template, str(status)))

    def documented(self) -> set[tuple[str, str, str]]:
        return {(m.upper(), t, s) for t, ops in self.doc["paths"].items()
                for m, op in ops.items() for s in op["responses"]}
