"""When to change the size of the workload behind a group: ``spec.autoscaling``.

Rule of this module: pure. ``now`` is the caller's monotonic seconds, every sample carries
the moment it was taken on that clock; no I/O. The operator's adapter reads the target's
replicas through its ``scale`` subresource, feeds :meth:`Autoscaler.decide`, writes the
answer's replicas back through the same subresource and reports it with
:meth:`Autoscaler.scaled`; the simulation and the benchmarks drive the same object.

The input is ``status.load.recommendedMembers`` (:mod:`kgroup.core.operator.sizing`), a
figure that changes at most every 30 s and has no hysteresis of its own. The rule
(docs/load-balancing.md, "Autoscaling", argues it):

* **Bounds.** The recommendation is clamped to ``[minMembers, maxMembers]`` (and to the
  partitions: a member beyond them would hold nothing). Replicas outside the bounds (set
  by hand, or the bounds changed) are brought to the nearest bound at once, but not
  while the group rebalances.
* **Up on the second look.** A recommendation above the replicas sets the replicas to
  it when the take before it (since the last change) was above them too: the first take
  after a step of the input sees part of it (a take spans 30 s, and the apps' reported
  rates trail their work), so acting on it grows the group a little, and then again
  once the pods it asked for have joined and the backlog has grown meanwhile (4 -> 5
  -> 11 -> 13 on the model group of ``tests/test_sizing_dynamics.py``). Waiting one take
  (30 s) instead lands in one change (4 -> 13): the recommendation it acts on already
  counts the backlog that grows while the new pods start
  (:func:`~kgroup.core.operator.sizing.recommend_members`, ``start_seconds``). A
  recommendation above the replicas only once (a spike) changes nothing.
* **Down late, to the peak, and only for a real drop.** The replicas go down only when
  *every* recommendation taken in the last ``scaleDownDelaySeconds`` (and since the last
  change) was below ``replicas / (1 + scaleDownTolerance)``, and then to the *largest*
  of them (never below what the window asked for). A dip shorter than the delay changes
  nothing; a drop smaller than the tolerance changes nothing.
* **One change at a time.** No change while the group rebalances, nor (but for the
  bounds) until the group has as many members as the last change asked for (at most
  :data:`SETTLE_SECONDS` after it: pods that cannot start must not freeze the
  autoscaler).

Why it cannot flap. Let every recommendation (as clamped to the bounds) lie in a band
``[L, U]`` with ``U <= (1 + tolerance) * L`` (noise of +-20 % around a level gives
U/L = 1.5, the default tolerance 0.5). A scale-down needs a window whose largest
recommendation ``p`` has ``p * (1 + tolerance) < replicas``. Every change lands on a
recommendation (up: the latest; down: the window's peak), so after the first change the
replicas are in ``[L, U]``, and then ``p * (1 + tolerance) >= L * (1 + tolerance) >= U
>= replicas``: no scale-down can happen again (hence the strict inequality: 12 -> 8 is
within +-20 % of 10). Scale-ups only raise the replicas, each to a value ``<= U`` (the
second look only delays them). So
inside the band the replicas change at most ``U - L + 1`` times, all but the first
upwards, and then never; started at or above the band's top, not at all (or once, down,
when started above ``(1 + tolerance) * U``). Noise wider than the band can move the
replicas, but no two changes are closer than the time it takes the group to settle, and
no scale-down comes sooner than ``scaleDownDelaySeconds`` after the last change.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "SETTLE_SECONDS",
    "UP_TAKES",
    "Autoscaler",
    "Saved",
    "ScaleChange",
    "ScaleSettings",
]

SETTLE_SECONDS = 300.0
"""After a change, the group must reach the new size (as members) before the next
change, but waits at most this long (pods that cannot be scheduled never join)."""

UP_TAKES = 2
"""A scale-up needs this many takes in a row (since the last change) above the replicas:
the latest and the one before it."""


@dataclass(frozen=True)
class ScaleSettings:
    """``spec.autoscaling``'s knobs (and the partitions, a bound of their own)."""

    min_members: int
    max_members: int
    scale_down_delay_seconds: float = 300.0
    scale_down_tolerance: float = 0.5
    partitions: int | None = None

    def clamp(self, members: int) -> int:
        """``members`` within ``[min, max]`` and at most the partitions; a ``min`` above
        ``max`` (the CRD refuses it) counts as ``max``."""
        top = self.max_members if self.partitions is None \
            else min(self.max_members, self.partitions)
        top = max(1, top)
        return max(min(self.min_members, top), min(members, top), 1)


@dataclass(frozen=True)
class ScaleChange:
    """Set the target's replicas to ``replicas`` (``previous`` as read), because
    ``reason``."""

    replicas: int
    previous: int
    reason: str


@dataclass(frozen=True)
class Saved:
    """What the autoscaler keeps in ``status.autoscaling`` so that a restarted operator
    decides as the one before it would have (times on the caller's clock): the window of
    a coming scale-down (:meth:`Autoscaler.window`: since when every recommendation was
    below ``below_replicas / (1 + tolerance)``, and the largest of them), the take a
    coming scale-up waits to see confirmed (above ``above_replicas``), and the last
    change (when, and the replicas it asked for: the settling rule waits for them)."""

    below_since: float | None = None
    below_peak: int | None = None
    below_replicas: int | None = None
    last_change_at: float | None = None
    last_change_replicas: int | None = None
    # the latest take, when it was above the replicas (a scale-up waits for the next)
    above_at: float | None = None
    above_value: int | None = None
    above_replicas: int | None = None


@dataclass
class Autoscaler:
    """The autoscaler's memory of one group (the operator process's; what a restart
    needs is kept in the status: :class:`Saved`, :meth:`window`, :meth:`restore`)."""

    # recommendations (clamped) taken since the last change: (taken at, members)
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    last_change_at: float | None = None  # on the caller's clock
    last_change: ScaleChange | None = None  # made by this process
    settle_for: int | None = None  # the replicas the last change asked for
    waiting: str = ""  # why the last decision changed nothing (for the status)
    # how many takes in a row a scale-up needs (UP_TAKES; a documented seam: the tests'
    # broken variant sets 1, up at the first look)
    up_takes: int = UP_TAKES
    # seconds the last scale-up took until its members had joined (None: not seen yet):
    # how long new pods take to start, for the recommendation's start allowance
    start_seconds: float | None = None
    _up: bool = field(default=False, repr=False)  # the last change was up, not yet joined

    def restore(self, saved: Saved, *, replicas: int | None, settings: ScaleSettings
                ) -> None:
        """Start from what an earlier process saved (call before the first
        :meth:`observe`). The window is taken only while it still holds: the replicas are
        those it was below, and its peak is below them by the tolerance (the settings may
        have changed)."""
        if saved.last_change_at is not None:
            self.last_change_at = saved.last_change_at
            self.settle_for = saved.last_change_replicas
        if saved.above_at is not None and saved.above_value is not None \
                and replicas == saved.above_replicas:
            above = settings.clamp(saved.above_value)
            if replicas is not None and above > replicas:
                self.samples.append((saved.above_at, above))
            return
        if saved.below_since is None or saved.below_peak is None \
                or saved.below_replicas is None or replicas != saved.below_replicas:
            return
        peak = settings.clamp(saved.below_peak)
        if peak * (1 + settings.scale_down_tolerance) < replicas - 1e-9:
            self.samples.appendleft((saved.below_since, peak))

    def saved(self, replicas: int | None, settings: ScaleSettings) -> Saved:
        """What :meth:`restore` needs, as of now (``replicas``: as read)."""
        window = None if replicas is None else self.window(replicas, settings)
        above = self.samples[-1] if self.samples and replicas is not None \
            and self.samples[-1][1] > replicas else None
        return Saved(below_since=None if window is None else window[0],
                     below_peak=None if window is None else window[1],
                     below_replicas=None if window is None else replicas,
                     last_change_at=self.last_change_at,
                     last_change_replicas=self.settle_for,
                     above_at=None if above is None else above[0],
                     above_value=None if above is None else above[1],
                     above_replicas=None if above is None else replicas)

    def window(self, replicas: int, settings: ScaleSettings) -> tuple[float, int] | None:
        """Since when every recommendation (since the last change) has been below
        ``replicas / (1 + tolerance)``, and the largest of them; None: the latest is
        not."""
        start: float | None = None
        peak = 0
        for taken, value in reversed(self.samples):
            if value * (1 + settings.scale_down_tolerance) >= replicas - 1e-9:
                break
            start, peak = taken, max(peak, value)
        if start is None:
            return None
        since = self.last_change_at if self.last_change_at is not None else -math.inf
        return max(start, since), peak

    def observe(self, taken_at: float, recommended: int | None,
                settings: ScaleSettings) -> None:
        """A recommendation taken at ``taken_at`` (the same figure seen again is kept
        once; one taken before the last change is stale and ignored)."""
        if recommended is None:
            return
        if self.last_change_at is not None and taken_at < self.last_change_at:
            return
        if self.samples and self.samples[-1][0] >= taken_at:
            return
        self.samples.append((taken_at, settings.clamp(recommended)))

    def decide(self, now: float, *, replicas: int | None, settings: ScaleSettings,
               rebalancing: bool, members: int) -> tuple[ScaleChange | None, float | None]:
        """The change to make now (None: none) and when to look again (None: at the next
        recommendation). ``replicas``: the target's as read (None: unknown, no change);
        ``rebalancing``: the group is moving partitions; ``members``: its members now."""
        horizon = now - settings.scale_down_delay_seconds
        # keep the samples the window needs, and the last one before it (it covers the
        # window's start: the figure held from then on), and the takes a scale-up looks at
        while len(self.samples) > max(1, self.up_takes) and self.samples[1][0] <= horizon:
            self.samples.popleft()
        if replicas is None or not self.samples:
            self.waiting = "no recommendation yet" if replicas is not None \
                else "the target's replicas are unknown"
            return None, None
        if rebalancing:
            self.waiting = "the group is rebalancing"
            return None, None
        latest = self.samples[-1][1]
        bounded = settings.clamp(replicas)
        if bounded < replicas:  # the bounds are a command: not held back by the settling
            return self._change(now, bounded, replicas,
                                f"above maxMembers {settings.max_members}"), None
        if bounded > replicas:
            if latest > bounded:
                return self._change(now, latest, replicas,
                                    f"recommended {latest} members, {replicas} replicas: "
                                    f"up at once"), None
            return self._change(now, bounded, replicas,
                                f"below minMembers {settings.min_members}"), None
        if self.settle_for is not None and self.last_change_at is not None \
                and members != self.settle_for \
                and now < self.last_change_at + SETTLE_SECONDS:
            self.waiting = f"waiting for {self.settle_for} members (has {members})"
            return None, self.last_change_at + SETTLE_SECONDS - now
        self._joined(now, members)
        if latest > replicas:
            return self._up_change(now, latest, replicas)
        return self._down(now, replicas, settings)

    def _joined(self, now: float, members: int) -> None:
        """The last scale-up's members have all joined: how long that took is kept."""
        if self._up and self.last_change_at is not None and members == self.settle_for:
            self.start_seconds = now - self.last_change_at
            self._up = False

    def _up_change(self, now: float, latest: int, replicas: int
                   ) -> tuple[ScaleChange | None, float | None]:
        """Up to ``latest`` when the takes before it (since the last change) were above
        ``replicas`` too (:data:`UP_TAKES` in a row); else wait for the next take."""
        recent = [value for _, value in list(self.samples)[-self.up_takes:]]
        if len(recent) < self.up_takes or min(recent) <= replicas:
            self.waiting = (f"recommended {latest} members, {replicas} replicas: up if the "
                            f"next figures say so too")
            return None, None
        return self._change(now, latest, replicas,
                            f"recommended {latest} members, {replicas} replicas: up"), None

    def _down(self, now: float, replicas: int, settings: ScaleSettings
              ) -> tuple[ScaleChange | None, float | None]:
        delay = settings.scale_down_delay_seconds
        window = self.window(replicas, settings)
        if window is None:
            self.waiting = ""
            return None, None
        began, peak = window
        if now - began < delay:
            self.waiting = (f"recommended at most {peak} for {now - began:.0f} s of "
                            f"{delay:.0f} s before scaling down")
            return None, began + delay - now
        return self._change(now, peak, replicas,
                            f"recommended at most {peak} members for {delay:.0f} s, "
                            f"{replicas} replicas: down"), None

    def _change(self, now: float, target: int, replicas: int, why: str) -> ScaleChange:
        self.waiting = ""
        return ScaleChange(target, replicas, why)

    def scaled(self, now: float, change: ScaleChange) -> None:
        """``change`` was written at ``now``: the window starts again after it."""
        self.last_change_at = now
        self.last_change = change
        self.settle_for = change.replicas
        self._up = change.replicas > change.previous
        latest = self.samples[-1] if self.samples else None
        self.samples.clear()
        if latest is not None:  # the figure still stands until the next one is taken
            self.samples.append((now, latest[1]))
