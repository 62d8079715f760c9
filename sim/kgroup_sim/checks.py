"""The invariants, checked after every simulated event.

Rules of this module (the definitions the simulation's verdicts rest on):

* **Safety.** A member *claims* a partition while its app view (``Member.view`` on the
  member's own clock, exactly what the app client reports) lists it, active or revoking.
  No two sessions may claim one partition at one instant. Between two events a view can
  only shrink (its fencing deadline passes), so comparing a member's view whenever it
  changes against every other member's last view that is still before its deadline checks
  every instant.
* **Token order.** Each new claimant of a partition holds a token strictly above every
  token any earlier claimant held: a stale owner's token is always lower.
* **Fenced sink.** The app opens a fenced sink with each token it is handed and writes
  under it; the sink refuses a token below the highest it has seen. A write the sink
  *accepts* from a session other than the one that opened it last is a zombie's write
  landing on the new owner's data: a violation (its token was not lower). An open the sink
  refuses is a new owner holding a token below a stale one: a violation.
* **Store.** Every acquisition (holder set on a partition Lease) raises the token.
* **Reshape order.** A partition of a newer generation (a *successor*) may be acquired
  only once every one of its predecessors was read to its seal: its Lease in the store
  records a completed release (``kgroup.dev/completed``, ``lease_codec.completed_token``).
  Completion is taken from the stored Leases, not from the operator's ``status.layout``
  (which could be wrong); the lineage's shape (which partitions succeed which) is taken
  from every ``status.layout`` the store commits, kept after the oldest generations
  retire. A completion is a fact about the data (read to its seal), so once recorded it
  counts even if the Lease is written again later.
* **Hand edits.** A lock an admin deletes is taken from its holder without its consent:
  until the holder sees it gone, it and the next owner may both claim the partition. Such
  an overlap is not a safety violation only when the older claim's token is one the
  deletion revoked; the fenced sink must still refuse the old holder's writes.
* **Oscillation** (load mode, :class:`OscillationCheck`). Once the faults have ended and
  the load has stopped changing (its last shift), the planner has ``settle`` seconds to
  rebalance; in the ``window`` seconds after that, with the load steady up to its noise,
  the target may move at most ``max_moves`` partitions (0: none) in at most
  ``max_rebalances`` changes. Membership is settled then (no faults), so every change of
  target in the window is a load rebalance. A planner that chases noise changes the
  target at nearly every load refresh (30 s); one whose band noise rarely crosses moves
  a few partitions once in a while.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kgroup.core.lineage import Lineage
from kgroup.core.ranges import format_ranges, parse_ranges

__all__ = ["Checker", "Claim", "OscillationCheck", "Violation", "target_moves"]


@dataclass(frozen=True)
class Violation:
    kind: str  # safety | token-order | sink | store-token | liveness | reshape-order | ...
    time: float  # true simulated seconds
    detail: str
    step: int = 0  # the kernel's event number


@dataclass(frozen=True)
class OscillationCheck:
    """After the faults and the load's last shift, ``settle`` seconds to rebalance, then
    in the next ``window`` seconds at most ``max_moves`` partitions moved and at most
    ``max_rebalances`` changes of target that moved any (None: that one not bounded).

    ``late_above``: a change in the window from a target whose busiest member, on the
    true (noise-free) rates, was above this many times the mean is *late settling* (a
    real imbalance the planner waited to be sure of), counted apart and not bounded;
    the others are *noise moves* and are bounded (None: every change is bounded). Set it
    to the shipped trigger (1.20), not to a variant's: a planner without hysteresis moves
    at any imbalance, and those moves stay counted."""

    settle: float = 180.0
    window: float = 300.0
    max_moves: int | None = 0
    max_rebalances: int | None = None
    late_above: float | None = None

    def exceeded(self, moves: int, rebalances: int) -> bool:
        return (self.max_moves is not None and moves > self.max_moves) or (
            self.max_rebalances is not None and rebalances > self.max_rebalances)


def target_moves(epochs: Sequence[tuple[float, Any, Mapping[str, str]]], since: float,
                 until: float = float("inf")) -> tuple[int, int]:
    """``(partitions moved, targets that moved any)`` over the target changes at times in
    ``(since, until]``; ``epochs`` are ``(time, epoch, status.assignment)`` in time order.
    A partition moves when its target owner changes (a first owner is no move)."""
    moved = changes = 0
    before: dict[int, str] | None = None
    for t, _, target in epochs:
        owners = {p: m for m, ranges in target.items() for p in parse_ranges(ranges)}
        if before is not None and since < t <= until:
            n = sum(1 for p, m in owners.items() if p in before and before[p] != m)
            moved += n
            changes += n > 0
        before = owners
    return moved, changes


@dataclass
class Claim:
    """One session's last seen view: partition -> token, valid until a true time."""

    owner: str
    tokens: dict[int, int]
    until: float


@dataclass
class Checker:
    violations: list[Violation] = field(default_factory=list)
    claims: dict[str, Claim] = field(default_factory=dict)  # by process key
    last_claim: dict[int, tuple[str, int]] = field(default_factory=dict)
    sink_high: dict[int, int] = field(default_factory=dict)
    sink_opener: dict[int, str] = field(default_factory=dict)
    sink_accepted: int = 0
    sink_refused: int = 0
    revoked: dict[int, int] = field(default_factory=dict)  # partition -> token deleted by hand
    # partition -> the (pod/session, token) pairs whose lock was deleted by hand: only those
    # very holders may still open or claim with them until they see the deletion
    revoked_holders: dict[int, set[tuple[str, int]]] = field(default_factory=dict)
    step: int = 0  # kept current by the world
    # reshape order: partition -> its predecessors (from every layout committed), and
    # partition -> when its Lease first recorded a completed release (true time)
    predecessors: dict[int, tuple[int, ...]] = field(default_factory=dict)
    completed_at: dict[int, float] = field(default_factory=dict)
    successor_acquisitions: int = 0  # acquisitions of partitions with predecessors

    def layout_seen(self, lineage: Lineage) -> None:
        """A ``status.layout`` was committed: learn each partition's predecessors (a
        partition's are first known in the layout where it is new; numbers are never
        reused, so what was learnt stays true after its predecessors retire)."""
        for gen in lineage.generations[1:]:
            for p in gen.partitions:
                if p not in self.predecessors:
                    self.predecessors[p] = lineage.predecessors(p)

    def completion_seen(self, partition: int, now: float) -> None:
        self.completed_at.setdefault(partition, now)

    def acquired_in_order(self, partition: int, holder: str, now: float) -> None:
        """Partition ``partition``'s lock was acquired by ``holder`` now: every
        predecessor must be completed (recorded on its Lease) already."""
        preds = self.predecessors.get(partition, ())
        if not preds:
            return
        self.successor_acquisitions += 1
        waiting = [q for q in preds if q not in self.completed_at]
        if waiting:
            self.fail("reshape-order", now,
                      f"partition {partition} acquired by {holder} before its predecessors "
                      f"{_short(waiting)} were read to their seal (completed: "
                      f"{_short(q for q in preds if q in self.completed_at) or 'none'})")

    def revoke(self, partition: int, token: int, holder: str | None = None) -> None:
        """An admin deleted the lock of ``partition`` carrying ``token`` (held by
        ``holder``, ``pod/session`` as claims name their owner, if anyone held it)."""
        self.revoked[partition] = max(token, self.revoked.get(partition, -1))
        if holder:
            self.revoked_holders.setdefault(partition, set()).add((holder, token))

    def _revoked_holder(self, partition: int, session: str, token: int) -> bool:
        return (session, token) in self.revoked_holders.get(partition, ())

    def fail(self, kind: str, time: float, detail: str) -> None:
        self.violations.append(Violation(kind, time, detail, self.step))

    def update_claim(self, key: str, owner: str, tokens: dict[int, int], until: float,
                     now: float) -> None:
        """Process ``key`` now claims ``tokens`` (session ``owner``) until ``until``."""
        old = self.claims.get(key)
        self.claims[key] = Claim(owner, tokens, until)
        if not tokens or now >= until:
            return
        fresh = tokens if old is None or old.owner != owner else {
            p: t for p, t in tokens.items() if old.tokens.get(p) != t
        }
        for other_key, other in self.claims.items():
            if other_key == key or now >= other.until or not other.tokens:
                continue
            both = tokens.keys() & other.tokens.keys()
            for p in sorted(both):
                if min(tokens[p], other.tokens[p]) <= self.revoked.get(p, -1):
                    continue  # the older claim's lock was deleted by hand: fenced by token
                self.fail("safety", now,
                          f"partition {p}: {owner} (token {tokens[p]}) and {other.owner} "
                          f"(token {other.tokens[p]}) both claim it")
        for p, t in sorted(fresh.items()):
            prev = self.last_claim.get(p)
            if prev is not None and prev[0] != owner and t <= prev[1] \
                    and not self._revoked_holder(p, owner, t):  # see sink_open
                self.fail("token-order", now,
                          f"partition {p}: {owner} claims it with token {t}, not above "
                          f"{prev[1]} of the earlier claimant {prev[0]}")
            self.last_claim[p] = (owner, t)

    def drop_claim(self, key: str) -> None:
        self.claims.pop(key, None)

    def sink_open(self, owner: str, partition: int, token: int, now: float) -> None:
        high = self.sink_high.get(partition, -1)
        if token < high and self._revoked_holder(partition, owner, token):
            # A lock deleted by hand (or its holder's member Lease): its holder may open
            # until it sees the deletion (docs/design.md, Limitations); the sink refuses
            # the stale token, as update_claim lets such a claim overlap.
            self.sink_refused += 1
            return
        if token < high:
            self.fail("sink", now,
                      f"partition {partition}: new owner {owner} opens with token {token} "
                      f"below the stale {high} of {self.sink_opener.get(partition)}")
            return
        self.sink_high[partition] = token
        self.sink_opener[partition] = owner

    def sink_write(self, owner: str, partition: int, token: int, now: float) -> None:
        high = self.sink_high.get(partition, -1)
        if token < high:
            self.sink_refused += 1
            return
        self.sink_accepted += 1
        opener = self.sink_opener.get(partition)
        if opener is not None and opener != owner:
            self.fail("sink", now,
                      f"partition {partition}: write of {owner} under token {token} accepted "
                      f"after {opener} opened with token {high}")
        self.sink_high[partition] = token

    def store_acquired(self, partition: int, old_token: int, new_token: int, holder: str,
                       now: float) -> None:
        if new_token <= old_token:
            self.fail("store-token", now,
                      f"partition {partition}: {holder} acquired with token {new_token}, "
                      f"not above {old_token}")


def _short(partitions: Iterable[int]) -> str:
    return format_ranges(sorted(partitions))
