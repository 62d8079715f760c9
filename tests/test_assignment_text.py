"""``GET /v1/assignment``'s body: the view's JSON, its partitions encoded once per view
the member keeps (kgroup_sidecar.http_api.AssignmentText: a sidecar's CPU at 1,000 partitions)."""

from __future__ import annotations

import json

import pytest

from kgroup.core.assignment import PartitionView, View
from kgroup_sidecar.http_api import AssignmentText


def view(parts: tuple[PartitionView, ...], valid: float = 5.0, version: int = 1) -> View:
    return View(member="pod-0", session="s", version=version, epoch=3, acked_epoch=3,
                fenced=False, valid_for_seconds=valid, partitions=parts)


def test_the_body_is_the_views_json_and_a_kept_view_is_encoded_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    encoded = {"n": 0}
    real = PartitionView.to_json

    def counting(self: PartitionView) -> dict[str, object]:
        encoded["n"] += 1
        return real(self)

    monkeypatch.setattr(PartitionView, "to_json", counting)
    kept = tuple(PartitionView(p, p + 100, "active", f"{p}-0") for p in range(1000))
    text = AssignmentText()
    first = text.render(view(kept, valid=5.0))
    assert json.loads(first) == view(kept, valid=5.0).to_json()
    assert encoded["n"] == 2000  # the body, and the reference to_json just above
    later = text.render(view(kept, valid=3.25))  # the same tuple: only the head moves
    assert encoded["n"] == 2000
    assert json.loads(later) == dict(json.loads(first), validForSeconds=3.25)
    # a new tuple with equal contents but one change: encoded again, never stale
    moved = (*kept[:-1], PartitionView(999, 5000, "revoking", "999-0", 12.5))
    body = json.loads(text.render(view(moved, version=2)))
    assert body["partitions"][-1] == {"partition": 999, "token": 5000, "state": "revoking",
                                      "position": "999-0", "revokeDeadlineSeconds": 12.5,
                                      "sealedBy": None}
    assert body["version"] == 2 and len(body["partitions"]) == 1000
    assert json.loads(text.render(view(()))) == view(()).to_json()
