"""What ``kubectl kgroup status GROUP`` shows, computed from objects already read (pure).

Input: the ConsumerGroup object and the group's Leases (``kgroup.dev/group=<group>``).
Output: a :class:`GroupView` (plain data; ``to_dict`` for ``-o json|yaml``) and its table.

Per partition: its owner (the lock's holder while that holder's member Lease carries the
lock's session; a lock whose holder has no such session is shown ``free``), the fencing
token (read through :mod:`kgroup.core.lease_codec`), the position and lag the owner's app
last reported (``kgroup.dev/health`` on the owner's member Lease, carried by its
renewals; without a report, the position handed over on the lock), and a state:

- ``stalled``: the owner's app reports the partition stalled (``kgroup.core.health``);
- ``revoking``: held by a member the target no longer gives it to (a move in progress);
- ``active``: held by its target member (or, with no target yet, by anyone);
- ``free``: no live holder.

Pods labelled with the group that run without the sidecar (``status.sidecarMissing``)
get a line of their own under the header, with the SidecarMissing condition below.

The partitions are those of the group's layout (``status.layout``; without one,
0..spec.partitions-1). While a reshape is under way (more than one generation kept) each
row also shows its place in the lineage (``open``, ``sealed``, ``completed``) and, for a
partition that waits, the predecessors it waits for.

A CLI reads no clock of the cluster's: whether a session is still renewed is the
operator's call (its ``ownedCount`` per member and ``unowned`` are in the status).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from kgroup import constants as C
from kgroup.core import lease_codec as codec
from kgroup.core.health import HealthSummary, parse_summary
from kgroup.core.layout_status import layout_from_status
from kgroup.core.lineage import Lineage, LineageError, initial
from kgroup.core.objects import Obj
from kgroup.core.ranges import clip_ranges, format_ranges

__all__ = ["GroupView", "MemberRow", "PartitionRow", "build_view", "render_table"]


@dataclass(frozen=True)
class PartitionRow:
    partition: int
    owner: str | None
    state: str  # active | revoking | free | stalled
    token: int
    position: str | None
    lag: int | None
    target: str | None  # the member the target assigns it to
    lineage: str = "open"  # open | sealed | completed (docs/reshape.md)
    waits_for: str = ""  # the predecessors not yet completed, as ranges


@dataclass(frozen=True)
class MemberRow:
    name: str
    assigned: int
    owned: int
    acknowledged_epoch: int
    lag: int | None
    stalled: int
    load: float | None = None  # events/s, as the status last took it


@dataclass(frozen=True)
class GroupView:
    name: str
    namespace: str
    phase: str
    epoch: int
    partitions: list[PartitionRow]
    members: list[MemberRow]
    conditions: list[Obj] = field(default_factory=list)
    stalled: int = 0
    stalled_partitions: str = ""
    unowned: int = 0
    load: Obj | None = None  # status.load as written (rate, lag, recommendedMembers, ...)
    generation: int = 1
    generations: int = 1  # kept in status.layout: more than one while a reshape runs
    # status.sidecarMissing: running pods labelled with the group without the sidecar
    sidecar_missing: int = 0
    sidecar_missing_pods: list[str] = field(default_factory=list)

    def to_dict(self) -> Obj:
        return asdict(self)


def _target(status: Obj, partitions: int) -> dict[int, str]:
    owner: dict[int, str] = {}
    for member, ranges in (status.get("assignment") or {}).items():
        for p in clip_ranges(str(ranges), limit=partitions) or ():  # never expanded past
            owner[p] = member
    return owner


def _lineage(status: Obj, partitions: int) -> Lineage | None:
    try:
        return layout_from_status(status.get("layout"), partitions)
    except LineageError:
        return initial(partitions) if partitions >= 1 else None


def build_view(group: Obj, leases: Iterable[Obj]) -> GroupView:
    md = codec.meta(group)
    spec = group.get("spec") or {}
    status = group.get("status") or {}
    lineage = _lineage(status, int(spec.get("partitions") or 0))
    numbers = sorted(lineage.partitions) if lineage is not None else []
    partitions = lineage.next_partition if lineage is not None else 0  # numbers below
    target = _target(status, partitions)

    sessions: dict[str, str | None] = {}
    health: dict[str, HealthSummary] = {}
    locks = {}
    for body in leases:
        if codec.is_member(body):
            ml = codec.parse_member_lease(body).value
            if ml is None:
                continue
            sessions[ml.member] = ml.session
            summary = parse_summary(codec.annotations_of(body).get(C.ANNOTATION_HEALTH),
                                    partitions=partitions)
            if summary is not None:
                health[ml.member] = summary
        elif codec.is_partition(body):
            lock = codec.parse_partition_lease(body).value
            if lock is not None and lock.partition < partitions:
                locks[lock.partition] = lock

    rows = []
    for p in numbers:
        lock = locks.get(p)
        holder = lock.holder if lock is not None else None
        live = holder is not None and lock is not None and lock.session is not None \
            and sessions.get(holder) == lock.session
        owner = holder if live else None
        report = health.get(owner) if owner else None
        lag, position = (report.partitions.get(p, (None, None)) if report else (None, None))
        if position is None and lock is not None:
            position = lock.position
        if owner is None:
            state = "free"
        elif report is not None and p in report.stalled:
            state = "stalled"
        elif target and target.get(p) != owner:
            state = "revoking"
        else:
            state = "active"
        waits = [q for q in lineage.predecessors(p) if q not in lineage.completed] \
            if lineage is not None else []
        rows.append(PartitionRow(p, owner, state, lock.token if lock else 0, position, lag,
                                 target.get(p), str(lineage.state(p)) if lineage else "open",
                                 format_ranges(waits)))

    bare = status.get("sidecarMissing")
    bare = bare if isinstance(bare, dict) else {}
    members = []
    for m in status.get("members") or []:
        name = str(m.get("name", ""))
        report = health.get(name)
        members.append(MemberRow(
            name=name,
            assigned=int(m.get("assignedCount") or 0),
            owned=int(m.get("ownedCount") or 0),
            acknowledged_epoch=int(m.get("acknowledgedEpoch") or 0),
            lag=report.lag if report else None,
            stalled=report.stalled_count if report else 0,
            load=m.get("load") if isinstance(m.get("load"), (int, float)) else None,
        ))
    return GroupView(
        name=str(md.get("name", "")), namespace=str(md.get("namespace", "")),
        phase=str(status.get("phase") or "Unknown"), epoch=int(status.get("epoch") or 0),
        partitions=rows, members=members, conditions=list(status.get("conditions") or []),
        stalled=int(status.get("stalled") or 0),
        stalled_partitions=str(status.get("stalledPartitions") or ""),
        unowned=int(status.get("unowned") or 0),
        load=status["load"] if isinstance(status.get("load"), dict) else None,
        generation=lineage.latest.number if lineage is not None else 1,
        generations=len(lineage.generations) if lineage is not None else 1,
        sidecar_missing=int(bare.get("count") or 0),
        sidecar_missing_pods=[str(p) for p in bare.get("pods") or []],
    )


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]]


def _dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _load_line(load: Obj) -> str:
    """status.load in one line: rate, lag, balance and the recommended size."""
    recommended = load.get("recommendedMembers")
    return (f"Load: {_dash(load.get('rate'))} events/s, lag {_dash(load.get('lag'))}, "
            f"busiest/mean {_dash(load.get('busiestOverMean'))} "
            f"(best possible {_dash(load.get('bound'))}), recommended members "
            f"{_dash(recommended)} (measured {_dash(load.get('measuredAt'))})")


def _sidecar_missing_line(view: GroupView) -> str:
    """status.sidecarMissing in one line: how many pods, the first of them by name."""
    more = view.sidecar_missing - len(view.sidecar_missing_pods)
    names = ", ".join(view.sidecar_missing_pods) + (f" and {more} more" if more > 0 else "")
    pods, them = ("pod", "it") if view.sidecar_missing == 1 else ("pods", "them")
    return (f"Without the sidecar: {view.sidecar_missing} {pods} labelled with the group "
            f"({names}), taking no part in it; delete {them} to have {them} re-created "
            "with the sidecar")


def render_table(view: GroupView) -> str:
    """The human view: a header line, partitions, members, conditions (kubectl style)."""
    lines = [f"ConsumerGroup {view.namespace}/{view.name}: {view.phase}, epoch {view.epoch}, "
             f"{len(view.partitions)} partitions, {len(view.members)} members, "
             f"unowned {view.unowned}, stalled {view.stalled}"
             + (f" ({view.stalled_partitions})" if view.stalled_partitions else "")]
    if view.generations > 1:  # a reshape under way: where each partition is in it
        lines[0] += f", generation {view.generation} ({view.generations} kept)"
    if view.load is not None:
        lines.append(_load_line(view.load))
    if view.sidecar_missing:
        lines.append(_sidecar_missing_line(view))
    lines.append("")
    if view.generations > 1:
        lines += _table(("PARTITION", "OWNER", "STATE", "TOKEN", "POSITION", "LAG",
                         "LAYOUT", "WAITS-FOR"), [
            (str(r.partition), _dash(r.owner), r.state, str(r.token), _dash(r.position),
             _dash(r.lag), r.lineage, _dash(r.waits_for)) for r in view.partitions])
    else:
        lines += _table(("PARTITION", "OWNER", "STATE", "TOKEN", "POSITION", "LAG"), [
            (str(r.partition), _dash(r.owner), r.state, str(r.token), _dash(r.position),
             _dash(r.lag)) for r in view.partitions])
    lines.append("")
    lines += _table(("MEMBER", "ASSIGNED", "OWNED", "ACK-EPOCH", "LAG", "STALLED", "LOAD/S"), [
        (m.name, str(m.assigned), str(m.owned), str(m.acknowledged_epoch), _dash(m.lag),
         str(m.stalled), _dash(m.load)) for m in view.members])
    lines.append("")
    lines += _table(("CONDITION", "STATUS", "REASON", "SINCE", "MESSAGE"), [
        (str(c.get("type", "")), str(c.get("status", "")), str(c.get("reason", "")),
         _dash(c.get("lastTransitionTime")), str(c.get("message", "")))
        for c in view.conditions])
    return "\n".join(lines)
