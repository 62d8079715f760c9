"""The member's pacing: how long its API requests wait, when failed ones are retried, and
how many acquisitions it has in flight. Pure: times are seconds the caller measured.

A renewal request must give up early enough to be retried before the fencing deadline:
:func:`request_timeout` and :func:`renew_retry_seconds` derive both from the lease timing,
and the adapter uses them for every API request. The state machine
(:mod:`kgroup.core.member.reconcile`) retries session starts and partitions with
:data:`SESSION_BACKOFF` and :data:`PARTITION_BACKOFF`.
"""

from __future__ import annotations

from kgroup.core.backoff import Backoff
from kgroup.core.locks import LeaseTiming

SESSION_RETRY_SECONDS = 1.0
"""Pause before the first retry of a failed session start or a failed acquisition/release
(before the spread of :data:`SESSION_BACKOFF` / :data:`PARTITION_BACKOFF`)."""

SESSION_BACKOFF = Backoff(base=SESSION_RETRY_SECONDS, cap=8.0)
"""Retries of a session start: 1, 2, 4, 8, 8 ... s, each spread by +-25 %. A member without
a session holds nothing, so a slower retry delays only its joining; a fixed 1 s retry of
every member at once (a GET and a write each) is what kept an overloaded API server
overloaded (docs/design.md, "Retries back off, spread")."""

PARTITION_BACKOFF = Backoff(base=SESSION_RETRY_SECONDS, cap=2.0)
"""Retries of one partition's acquisition or release: 1, 2, 2 ... s, spread by +-25 %. Kept
short: a failed takeover's retry is failover time (at most 16 acquisitions are in flight
anyway, :data:`ACQUISITIONS_IN_FLIGHT`)."""

ACQUISITIONS_IN_FLIGHT = 16
"""At most this many acquisitions of one member in flight; the next are decided as these
end (why: docs/design.md, "A member sends at most 16 acquisitions at once")."""

MIN_REQUEST_TIMEOUT = 0.2
"""Floor of :func:`request_timeout`: below it a healthy API server's answer may not come."""


def renew_window(timing: LeaseTiming) -> float:
    """Seconds between a regular renewal's send time and the fencing deadline it must beat:
    ``duration - margin - renew_interval`` (the previous renewal was sent one interval
    earlier, and the deadline is measured from that send)."""
    return timing.duration - timing.effective_margin - timing.renew_interval


def request_timeout(timing: LeaseTiming) -> float:
    """How long an API request may wait for its answer, derived from the lease timing.

    A renewal whose answer is lost must time out and be retried while the session still
    has time: at most half the renew interval, and at most a third of the window between
    the renewal's send and the fencing deadline, so at least two more attempts fit in it.
    (15 s / 5 s: 2.33 s, not the 6 s that made one lost answer fence the member.)
    """
    return max(MIN_REQUEST_TIMEOUT, min(timing.renew_interval / 2, renew_window(timing) / 3))


def renew_retry_seconds(timing: LeaseTiming) -> float:
    """Pause before retrying a failed renewal: soon (the timeout already waited), but not
    a spin when the API server refuses connections at once."""
    return max(0.05, min(0.5, request_timeout(timing) / 4))
