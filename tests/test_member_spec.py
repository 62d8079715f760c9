"""The sidecar's reader of the group spec (kgroup.core.member.group_spec) agrees with the API
model (kgroup.crd_models.ConsumerGroupSpec) on every lease timing and drain timeout: the same
defaults, the same bounds, the same refusals."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kgroup.core.locks import LeaseTiming
from kgroup.core.member.group_spec import member_spec
from kgroup.crd_models import ConsumerGroupSpec

SELECTOR = {"matchLabels": {"app": "w"}}


def model_reading(raw: dict[str, Any]) -> tuple[LeaseTiming, float] | None:
    try:
        spec = ConsumerGroupSpec.model_validate({"partitions": 4, "selector": SELECTOR, **raw})
        return (LeaseTiming(duration=spec.lease.duration_seconds,
                            renew_interval=spec.lease.renew_interval_seconds),
                float(spec.handoff.drain_timeout_seconds))
    except (ValidationError, ValueError):
        return None


def own_reading(raw: dict[str, Any]) -> tuple[LeaseTiming, float] | None:
    try:
        return member_spec(raw)
    except ValueError:
        return None


def test_the_defaults_are_the_models() -> None:
    assert own_reading({}) == model_reading({}) is not None
    timing, drain = member_spec({})
    assert (timing.duration, timing.renew_interval, drain) == (8, 2, 30.0)


@pytest.mark.parametrize("raw", [
    {"lease": {"durationSeconds": 1}}, {"lease": {"durationSeconds": 3601}},
    {"lease": {"renewIntervalSeconds": 0}}, {"handoff": {"drainTimeoutSeconds": -1}},
    {"handoff": {"drainTimeoutSeconds": 86401}}, {"lease": {"durationSeconds": "eight"}},
    {"lease": {"durationSeconds": 4, "renewIntervalSeconds": 4}},  # unsafe: renew too late
    {"lease": {"durationSeconds": 8.5}},
])
def test_what_the_model_refuses_the_sidecar_refuses(raw: dict[str, Any]) -> None:
    assert model_reading(raw) is None
    assert own_reading(raw) is None


small = st.integers(min_value=-2, max_value=90000)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.none(), small), st.one_of(st.none(), small),
       st.one_of(st.none(), small))
def test_both_readers_agree(duration: int | None, renew: int | None, drain: int | None) -> None:
    lease = {k: v for k, v in (("durationSeconds", duration),
                               ("renewIntervalSeconds", renew)) if v is not None}
    raw: dict[str, Any] = {"lease": lease}
    if drain is not None:
        raw["handoff"] = {"drainTimeoutSeconds": drain}
    assert own_reading(raw) == model_reading(raw)
