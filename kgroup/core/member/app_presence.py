"""What a sidecar knows of its app, and the rules that make *owned* mean *consumed*.

Rule of this module: it is pure (no clock, no I/O). The sidecar's local API reports each
call of the app (:meth:`AppPresence.asked`, :meth:`~AppPresence.called`, the long-polls
it holds open) and each answer that served the app its partitions
(:meth:`~AppPresence.served`); the member's step, the readiness rule and the health
summary read the verdicts. The simulation feeds the same object from its simulated app.

The words, as the local API defines them (docs/protocol.md, "The app's part"):

* The app **joins** with its first ``GET /v1/assignment`` (plain or long-poll): asking what
  it owns is saying it is ready to take partitions, as a Kafka consumer joins its group
  with its first ``poll()``. Before that the sidecar opens no session, so the pod is no
  member and no partition goes to an app that is still starting.
* The app **takes part** while one of its long-polls is open, or its last call (any of
  ``GET /v1/assignment``, ``POST /v1/health``, ``POST /v1/partitions/N/release``) is at
  most ``timeout`` seconds old. An app that stops taking part (hung, deadlocked, its
  follower thread dead) is Kafka's consumer past ``max.poll.interval.ms``: its sidecar
  leaves the group (revokes everything, ends its session) and joins again at the app's
  next call.
* A partition is **seen** once an answer served it to the app under its current token:
  the app may be working on it, so a revocation waits for its release (or the drain
  timeout). A partition the app has not seen is released at once on revocation or
  shutdown, with the position it was handed.
* A partition is **taken up** once the app made another call after the answer that served
  it (the next poll after a rebalance callback, the next micro-batch's ask, a health
  report): the pod is Ready only when every partition it holds is taken up.

Cheap by construction: this is memory in the sidecar (a few numbers per held partition);
nothing here writes to the API server. Leaving and joining are the session's own writes.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["DEFAULT_APP_TIMEOUT_SECONDS", "AppPresence", "AppState"]

DEFAULT_APP_TIMEOUT_SECONDS = 60.0
"""How long an app may go without calling its sidecar (no long-poll open) before it is
taken for gone: the sidecar leaves the group, and a held partition the app has not taken up
within it is reported stalled. Kafka's ``max.poll.interval.ms`` is 300 s; an app of kgroup
that follows its assignment (``kgroup.follower``, the client's ``listen``) keeps a
long-poll open all the time, so the bound only has to cover an app that asks per batch."""


@dataclass(frozen=True)
class AppState:
    """What the member's step needs to know of the app (:class:`kgroup.core.member.view.Snapshot`):
    whether it takes part, and which (partition, token) it has seen (asked only of the
    partitions being revoked, so a step at 1,000 held partitions does not walk them all)."""

    taking_part: bool  # joined, and not silent past the timeout
    seen: Callable[[int, int], bool] = lambda partition, token: True


@dataclass
class AppPresence:
    """One sidecar's record of its app. ``timeout`` 0 turns the app's part off: the sidecar
    joins at start and never leaves for silence (a sidecar with no app, as test harnesses
    and load generators run it); every partition then counts as seen and taken up."""

    timeout: float = DEFAULT_APP_TIMEOUT_SECONDS
    joined: bool = False
    last_call: float | None = None
    open_polls: int = 0
    _seq: int = 0  # orders calls and answers: one counter for both
    _last_call_seq: int = 0
    _last_new_serve_seq: int = 0  # the last answer that served a partition anew
    # partition -> (token, the sequence number of the first answer that served it)
    _served: dict[int, tuple[int, int]] = field(default_factory=dict)
    _served_parts: object = None  # the last served partitions' object (unchanged: skip)
    # (partition, token) -> when the sidecar first held it (for "not taken up within")
    _held_since: dict[tuple[int, int], float] = field(default_factory=dict)

    @property
    def gated(self) -> bool:
        return self.timeout > 0

    # ---- what the local API reports --------------------------------------------------

    def called(self, now: float) -> bool:
        """Any call of the app arrived (a report, a release, an ask). -> whether it changes
        a verdict (the app takes part again, or takes a partition up): the sidecar's loop
        then steps and publishes its readiness at once."""
        changes = (not self.taking_part(now)
                   or self._last_new_serve_seq > self._last_call_seq)
        self._seq += 1
        self._last_call_seq = self._seq
        self.last_call = now
        return changes

    def asked(self, now: float) -> bool:
        """``GET /v1/assignment`` arrived: a call, and the app's word that it is ready."""
        joins = not self.joined
        self.joined = True
        return self.called(now) or joins

    def poll_opened(self, now: float) -> bool:
        changes = self.asked(now)
        self.open_polls += 1
        return changes

    def poll_closed(self, now: float) -> None:
        """A long-poll ended (answered, or the connection went): the app was there until now."""
        self.open_polls = max(0, self.open_polls - 1)
        self.last_call = now

    def served(self, partitions: Iterable[tuple[int, int]], *, key: object = None) -> None:
        """An answer served the app these (partition, token) pairs. ``key``: an object that
        is the same only for the same partitions (the member keeps its view's tuple while
        its version stands), so a steady follower's answers cost a comparison."""
        if key is not None and key is self._served_parts:
            return
        self._served_parts = key
        self._seq += 1
        before, now_served = self._served, {}
        for p, token in partitions:
            old = before.get(p)
            if old is None or old[0] != token:
                old = (token, self._seq)
                self._last_new_serve_seq = self._seq
            now_served[p] = old
        self._served = now_served

    # ---- verdicts ----------------------------------------------------------------------

    def taking_part(self, now: float) -> bool:
        if not self.gated:
            return True
        if not self.joined:
            return False
        if self.open_polls > 0:
            return True
        return self.last_call is not None and now - self.last_call < self.timeout

    def silent_at(self) -> float | None:
        """When the app stops taking part unless it calls again (None: not on a clock)."""
        if not self.gated or not self.joined or self.open_polls > 0 or self.last_call is None:
            return None
        return self.last_call + self.timeout

    def seen(self, partition: int, token: int) -> bool:
        if not self.gated:
            return True
        served = self._served.get(partition)
        return served is not None and served[0] == token

    def taken_up(self, partition: int, token: int) -> bool:
        if not self.gated:
            return True
        served = self._served.get(partition)
        return served is not None and served[0] == token and self._last_call_seq > served[1]

    def state(self, now: float) -> AppState:
        """For the member's step."""
        return AppState(self.taking_part(now), self.seen)

    def not_taken_up(self, held: Mapping[int, int]) -> list[int]:
        """Held partitions the app has not taken up yet, sorted."""
        if not self.gated:
            return []
        return sorted(p for p, t in held.items() if not self.taken_up(p, t))

    def stalls(self, held: Mapping[int, int], now: float,
               reported: Container[int] | None = None) -> dict[int, str]:
        """Held partitions the sidecar itself sees stalled, with why: every one while the
        app does not take part; else each one the app has not taken up within ``timeout``
        of its acquisition, and — when the app reports health at all (``reported``: the
        partitions it has reported on under their current token; None: it never reports)
        — each one it has not reported on within ``timeout``: an app that reports is
        judged by its reports, so one that believes it lost a partition it still holds
        (and keeps polling) is seen. Stall detection does not rest on the app's own
        reports alone: an app that says nothing is seen too. Keeps when each was first
        held (call it with what is held at every renewal)."""
        if not self.gated:
            return {}
        since = {key: self._held_since.get(key, now) for key in held.items()}
        self._held_since = since
        if not self.taking_part(now):
            why = ("the app has not asked for its assignment yet" if not self.joined else
                   f"the app has not called its sidecar for {self.timeout:g}s or more")
            return dict.fromkeys(sorted(held), why)
        out: dict[int, str] = {}
        for p, t in sorted(held.items()):
            if now - since[(p, t)] < self.timeout:
                continue
            if not self.taken_up(p, t):
                out[p] = f"the app has not taken it up within {self.timeout:g}s"
            elif reported is not None and p not in reported:
                out[p] = f"the app has not reported on it within {self.timeout:g}s"
        return out
