"""pydantic models of the ConsumerGroup resource (``kgroup.dev/v1alpha1``).

These models are the single source of truth for the CRD: ``python -m kgroup_devtools.crdgen``
renders ``crds/`` from them, and a test fails when the checked-in YAML drifts.
Python attributes are snake_case; the wire (and the CRD) uses camelCase aliases.
Field-level validation that the API server must enforce lives in ``json_schema_extra``
(``x-kubernetes-validations`` CEL rules) so the generator can carry it into the CRD.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kgroup.constants import DRAIN_TIMEOUT_SECONDS, LEASE_DURATION_SECONDS, RENEW_INTERVAL_SECONDS

Phase = Literal["Pending", "Rebalancing", "Stable", "Degraded", "Paused"]
AssignorName = Literal["sticky", "range"]


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict that goes to the API server (defaults included)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


class LabelSelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(_Model):
    """A metav1.LabelSelector: the member pods of the group."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: dict[str, str]) -> bool:
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "In" and (not present or labels[req.key] not in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True

    def to_label_selector_string(self) -> str:
        """The ``labelSelector`` query string for list/watch calls."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        for req in self.match_expressions:
            if req.operator == "In":
                parts.append(f"{req.key} in ({','.join(req.values)})")
            elif req.operator == "NotIn":
                parts.append(f"{req.key} notin ({','.join(req.values)})")
            elif req.operator == "Exists":
                parts.append(req.key)
            else:
                parts.append(f"!{req.key}")
        return ",".join(parts)


class LeaseSettings(_Model):
    duration_seconds: int = Field(default=LEASE_DURATION_SECONDS[0],
                                  ge=LEASE_DURATION_SECONDS[1], le=LEASE_DURATION_SECONDS[2])
    renew_interval_seconds: int = Field(default=RENEW_INTERVAL_SECONDS[0],
                                        ge=RENEW_INTERVAL_SECONDS[1],
                                        le=RENEW_INTERVAL_SECONDS[2])


class HandoffSettings(_Model):
    drain_timeout_seconds: int = Field(default=DRAIN_TIMEOUT_SECONDS[0],
                                       ge=DRAIN_TIMEOUT_SECONDS[1], le=DRAIN_TIMEOUT_SECONDS[2])


class BalanceSettings(_Model):
    mode: Literal["count", "load"] = "count"
    tolerance: float = Field(default=0.15, ge=0, le=10)
    margin: float = Field(default=0.05, ge=0, le=10)
    dwell_seconds: int = Field(default=60, ge=0, le=86400)
    count_slack: float = Field(default=2.0, ge=1, le=1000)


class SizingSettings(_Model):
    catch_up_seconds: int = Field(default=300, ge=1, le=86400)


ReshapePolicy = Literal["Generations", "Append"]


class ReshapeChange(_Model):
    """One split or one merge (docs/reshape.md, "Splits and merges"): the change that makes
    generation ``generation`` of ``status.layout``. Applied once, when the newest
    generation is the one before; ``spec.partitions`` must say the count it leaves (one
    more after a split, one fewer after a merge)."""

    generation: int = Field(ge=2, le=1_000_000_000)
    split: int | None = Field(default=None, ge=0, le=999_999_999)
    merge: list[Annotated[int, Field(ge=0, le=999_999_999)]] | None = Field(
        default=None, min_length=2, max_length=2)


class ReshapeSettings(_Model):
    """What a change of ``spec.partitions`` does (docs/reshape.md, "Growth policy"), and
    an optional split or merge."""

    policy: ReshapePolicy = "Generations"
    change: ReshapeChange | None = None


class ScaleTargetRef(_Model):
    """The workload whose replicas the operator sets (same namespace), as an HPA's."""

    api_version: Literal["apps/v1"] = "apps/v1"
    kind: Literal["Deployment", "StatefulSet"]
    name: str = Field(min_length=1, max_length=253)


class AutoscalingSettings(_Model):
    min_members: int = Field(default=1, ge=1, le=100_000)
    max_members: int = Field(ge=1, le=100_000)
    scale_target_ref: ScaleTargetRef
    scale_down_delay_seconds: int = Field(default=300, ge=0, le=86400)
    scale_down_tolerance: float = Field(default=0.5, ge=0, le=10)


class ConsumerGroupSpec(_Model):
    partitions: int = Field(ge=1, le=100_000)
    selector: LabelSelector
    assignor: AssignorName = "sticky"
    stabilization_window_seconds: int = Field(default=5, ge=0, le=3600)
    stabilization_max_delay_seconds: int = Field(default=30, ge=0, le=86400)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    handoff: HandoffSettings = Field(default_factory=HandoffSettings)
    restart_grace_seconds: int = Field(default=0, ge=0, le=86400)
    stateful_set_restart_grace_seconds: int = Field(default=30, ge=0, le=86400)
    paused: bool = False
    balance: BalanceSettings = Field(default_factory=BalanceSettings)
    sizing: SizingSettings = Field(default_factory=SizingSettings)
    reshape: ReshapeSettings = Field(default_factory=ReshapeSettings)
    autoscaling: AutoscalingSettings | None = None
    source: dict[str, Any] = Field(default_factory=dict)


class MemberStatus(_Model):
    name: str
    assigned: str = ""
    assigned_count: int = 0
    owned_count: int = 0
    acknowledged_epoch: int = 0
    load: float | None = None


class LastRebalance(_Model):
    epoch: int
    reason: str
    moved: int
    started_at: str | None = None
    completed_at: str | None = None
    duration_seconds: float | None = None


class LoadStatus(_Model):
    rate: float = 0.0
    arrival: float | None = None
    lag: int | None = None
    busiest_over_mean: float | None = None
    bound: float | None = None
    recommended_members: int | None = None
    capacity: float | None = None
    measured_at: str | None = None


class AutoscalingStatus(_Model):
    desired_members: int | None = None
    replicas: int | None = None
    last_scale_time: str | None = None
    last_scale_replicas: int | None = None
    reason: str = ""
    scale_down_since: str | None = None
    scale_down_to: int | None = None
    scale_down_from: int | None = None
    scale_up_seen: str | None = None
    scale_up_to: int | None = None
    scale_up_from: int | None = None


class SidecarMissingStatus(_Model):
    """Running pods labelled with the group that have no kgroup sidecar container: how
    many, and the first of them by name (at most :data:`SIDECAR_MISSING_LISTED`)."""

    count: int = 0
    pods: list[str] = Field(default_factory=list)


SIDECAR_MISSING_LISTED = 10
"""status.sidecarMissing.pods names at most this many pods (the count says how many)."""


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class LayoutGeneration(_Model):
    generation: int = Field(ge=1)
    placement: Literal["modulo", "range"]
    partitions: str = Field(max_length=1_000_000)
    widths: str | None = Field(default=None, max_length=4_800_000)


class LayoutStates(_Model):
    open: str | None = Field(default=None, max_length=1_000_000)
    sealed: str | None = Field(default=None, max_length=1_000_000)
    completed: str | None = Field(default=None, max_length=1_000_000)


class Layout(_Model):
    """The group's partition lineage (``kgroup.core.layout_status``; docs/reshape.md)."""

    generation: int = Field(ge=1)
    next_partition: int = Field(ge=1)
    generations: list[LayoutGeneration] = Field(max_length=8)
    states: LayoutStates = Field(default_factory=LayoutStates)


class ConsumerGroupStatus(_Model):
    observed_generation: int | None = None
    epoch: int = 0
    phase: Phase | None = None
    member_count: int = 0
    unowned: int = 0
    stalled: int = 0
    stalled_partitions: str = ""
    assignment: dict[str, str] = Field(default_factory=dict)
    members: list[MemberStatus] = Field(default_factory=list)
    last_rebalance: LastRebalance | None = None
    load: LoadStatus | None = None
    autoscaling: AutoscalingStatus | None = None
    sidecar_missing: SidecarMissingStatus | None = None
    conditions: list[Condition] = Field(default_factory=list)
    layout: Layout | None = None
