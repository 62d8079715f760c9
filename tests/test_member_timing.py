"""Request timeouts derived from the lease timing (kgroup.core.member.pacing.request_timeout):
a renewal whose answer is lost is retried, at least twice, before the fencing deadline."""

from __future__ import annotations

import pytest

from kgroup.core.locks import LeaseTiming, fencing_deadline
from kgroup.core.member.pacing import renew_retry_seconds, renew_window, request_timeout

TIMINGS = [(15, 5), (6, 2), (10, 3), (30, 10), (3, 1), (60, 2), (10, 7), (2, 1)]
"""The simulation's timings, the defaults, and edges (windows of 1 s and 0.6 s, the floor)."""


def test_the_default_lease_times_a_request_out_at_a_fraction_of_the_renew_interval() -> None:
    timing = LeaseTiming(duration=15, renew_interval=5)
    assert request_timeout(timing) <= timing.renew_interval / 2
    assert request_timeout(timing) < 6.0  # the old 0.4 x duration, which fenced


@pytest.mark.parametrize(("duration", "renew"), TIMINGS)
def test_a_retry_is_answered_before_the_deadline_after_a_lost_answer(
    duration: float, renew: float,
) -> None:
    """Renewal sent one interval after the last confirmed one; its answer is lost; it
    times out and is retried, and that retry's answer still comes before the deadline."""
    timing = LeaseTiming(duration=duration, renew_interval=renew)
    last_sent = 100.0
    deadline = fencing_deadline(last_sent, duration, timing.effective_margin)
    sent = last_sent + renew
    attempts = 0
    while sent + request_timeout(timing) <= deadline:
        attempts += 1
        sent += request_timeout(timing) + renew_retry_seconds(timing)
    assert attempts >= 2, f"{duration}/{renew}: only {attempts} attempt(s) fit"
    assert attempts * request_timeout(timing) <= renew_window(timing)


@pytest.mark.parametrize(("duration", "renew"), TIMINGS)
def test_the_timeout_is_never_below_its_floor_nor_above_half_the_interval(
    duration: float, renew: float,
) -> None:
    timing = LeaseTiming(duration=duration, renew_interval=renew)
    assert 0.2 <= request_timeout(timing) <= max(0.2, renew / 2)
    assert 0.05 <= renew_retry_seconds(timing) <= 0.5
