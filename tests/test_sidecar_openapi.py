"""The sidecar's OpenAPI document: valid, served, and matching every route and status code
of the HTTP API (a real sidecar HTTP server on a scripted core, tests/test_client.py);
the e2e twin (e2e/tests/test_sidecar_openapi_process.py) runs a real sidecar process."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from openapi_spec_validator import validate

from kgroup.client import SidecarAddress, SidecarClient
from kgroup_sidecar import http_api
from kgroup_sidecar.http_api import build_app
from tests.openapi_check import DOC_FILE, Checker
from tests.test_client import Scripted, scripted, wait

__all__ = ["scripted"]


def call(sc: Scripted, method: str, path: str, body: bytes | None = None
         ) -> tuple[int, str, str]:
    conn = SidecarAddress.parse(sc.url).connection(90)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


def test_the_document_is_valid_openapi() -> None:
    validate(yaml.safe_load(DOC_FILE.read_text()))


def test_every_route_is_documented_and_every_documented_path_is_routed(
        scripted: Scripted) -> None:
    app = build_app(scripted.sc)
    routed = {(r.method, r.resource.canonical)
              for r in app.router.routes() if r.method != "HEAD" and r.resource}
    doc = Checker().doc
    documented = {(m.upper(), t) for t, ops in doc["paths"].items() for m in ops}
    assert routed == documented


def test_the_sidecar_serves_the_checked_in_document(scripted: Scripted) -> None:
    status, ctype, text = call(scripted, "GET", "/openapi.yaml")
    assert status == 200 and ctype.startswith("application/yaml")
    assert text == DOC_FILE.read_text()


def test_the_503_try_again_on_release_is_documented_and_answered(
        scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that the API does not confirm in time answers 503; the same request again
    then answers 200 (here: the scripted core never confirms until it is told to)."""
    checker = Checker()
    scripted.set(target=[0], epoch=1)
    c = SidecarClient(scripted.url)
    part = wait("held", lambda: c.assignment().partitions)[0]
    monkeypatch.setattr(http_api, "RELEASE_TIMEOUT", 0.3)
    held_back: list[Any] = []
    original = scripted.sc.logic.app_release

    def slow(partition: int, token: int, position: str | None,
             completed: bool = False) -> None:
        held_back.append((partition, token, position))  # the release is not started

    monkeypatch.setattr(scripted.sc.logic, "app_release", slow)
    body = f'{{"token": {part.token}, "position": "5-0"}}'.encode()
    status, ctype, text = call(scripted, "POST", "/v1/partitions/0/release", body)
    assert status == 503 and "try again" in text
    checker.check("POST", "/v1/partitions/0/release", status, ctype, text)
    monkeypatch.setattr(scripted.sc.logic, "app_release", original)
    status, ctype, text = call(scripted, "POST", "/v1/partitions/0/release", body)
    assert status == 200
    checker.check("POST", "/v1/partitions/0/release", status, ctype, text)


def test_the_group_before_it_was_seen_is_a_documented_503(scripted: Scripted) -> None:
    """The scripted core never sees a ConsumerGroup: GET /v1/group answers 503 as the
    document says (the real sidecar's 200 is checked in e2e)."""
    status, ctype, text = call(scripted, "GET", "/v1/group")
    assert status == 503 and "not been seen" in text
    Checker().check("GET", "/v1/group", status, ctype, text)


def test_the_checker_fails_on_an_undocumented_status_and_a_wrong_body() -> None:
    checker = Checker()
    with pytest.raises(AssertionError, match="undocumented"):
        checker.check("GET", "/v1/assignment", 404, "application/json", '{"error": "x"}')
    with pytest.raises(AssertionError, match="'released' is a required property"):
        checker.check("POST", "/v1/partitions/1/release", 200, "application/json", "{}")
    with pytest.raises(AssertionError, match="is not of type 'integer'"):
        checker.check("GET", "/v1/assignment", 200, "application/json", (
            '{"member": "a", "session": null, "version": "1", "epoch": null, '
            '"ackedEpoch": null, "fenced": true, "validForSeconds": 0, "partitions": []}'))
