"""Names shared by every kgroup component: API group, labels, annotations, Lease names.

The wire contract these names belong to is written down in docs/protocol.md.
"""

from __future__ import annotations

API_GROUP = "kgroup.dev"
API_VERSION = "v1alpha1"
KIND = "ConsumerGroup"
PLURAL = "consumergroups"
SHORT_NAME = "cg"
CRD_NAME = f"{PLURAL}.{API_GROUP}"

LABEL_GROUP = "kgroup.dev/group"
LABEL_ROLE = "kgroup.dev/role"
LABEL_MEMBER = "kgroup.dev/member"
LABEL_PARTITION = "kgroup.dev/partition"
ROLE_MEMBER = "member"
ROLE_PARTITION = "partition"

ANNOTATION_SESSION = "kgroup.dev/session"
ANNOTATION_EPOCH = "kgroup.dev/epoch"
ANNOTATION_POSITION = "kgroup.dev/position"
ANNOTATION_POSITION_TOKEN = "kgroup.dev/position-token"
# a sealed partition read to its seal marker: the token its final release was written
# under (equal to position-token while that release is the last one)
ANNOTATION_COMPLETED = "kgroup.dev/completed"
ANNOTATION_TOKEN = "kgroup.dev/token"
"""A partition lock's fencing token: the resourceVersion its acquisition replaced
(kgroup.core.tokens)."""
ANNOTATION_HEALTH = "kgroup.dev/health"
"""On a member Lease: the app's per-partition health summary (kgroup.core.health),
carried by the renewals the sidecar writes anyway."""
ANNOTATION_LOAD = "kgroup.dev/load"
"""On a member Lease: the app's per-partition rates and the member's lag (kgroup.core.load),
carried by the renewals the sidecar writes anyway."""
ANNOTATION_ASSIGNED = "kgroup.dev/assigned"
"""On a partition Lease: the member the operator assigned the partition to (its target
owner); only that member may acquire the lock (the chart's admission policy checks it)."""
ANNOTATION_ASSIGNED_UID = "kgroup.dev/assigned-uid"
"""On a partition Lease, beside the assignment mark: the uid of the pod the mark is for
(the pod of that name the operator saw; docs/design.md, "The mark binds the pod's uid").
The admission policy lets a worker acquire the lock only when its pod-bound token's
``authentication.kubernetes.io/pod-uid`` equals it: a pod re-created under the same name
is another pod until the operator moved the mark to it."""
ANNOTATION_HOLDER_UID = "kgroup.dev/holder-uid"
"""On a partition Lease: the uid of the pod holding it, written by the acquirer in the
write that takes it (the admission policy requires it to equal the pod-bound token's
``authentication.kubernetes.io/pod-uid``). Every later write of the holder (release,
position, renewal) is allowed only to the pod of that uid: a pod re-created under the
holder's name cannot release the old pod's locks nor write their positions. A lock
without it (taken by an older sidecar) is the holder's by name until its next
acquisition (docs/design.md, "The holder is a pod, not a name")."""
ANNOTATION_EXPIRED_SESSION = "kgroup.dev/expired-session"
"""On a partition Lease: the expiry mark. The operator (the group's failure detector) sets
it to the lock's session id once it saw that session over (unrenewed for a full lease
duration on its own clock after a quorum read, or its member Lease gone or carrying
another session); only then may a member other than the holder acquire the lock (the
chart's admission policy checks it). An acquisition clears it."""
ROLE_LEADER = "operator-leader"
"""kgroup.dev/role of the operator's leader-election Lease (it has no kgroup.dev/group)."""

MANAGED_BY = "app.kubernetes.io/managed-by"

SIDECAR_CONTAINER = "kgroup-sidecar"
"""The sidecar's container name in worker pods (the chart's ``kgroup.sidecarContainer``).
Its readiness is an *output* of membership (Ready once it holds its target), so the
operator's membership rule leaves it out."""


def member_lease_name(group: str, member: str) -> str:
    """The session Lease of `member` (a pod name) in `group`."""
    return f"{group}-member-{member}"


def partition_lease_name(group: str, partition: int) -> str:
    """The lock Lease of `partition` in `group`."""
    return f"{group}-partition-{partition}"

# The ConsumerGroup spec fields a sidecar reads, as (default, minimum, maximum): the API
# model (kgroup.crd_models) and the sidecar's own reader (kgroup.core.member.group_spec) share them.
LEASE_DURATION_SECONDS = (8, 2, 3600)
RENEW_INTERVAL_SECONDS = (2, 1, 3600)
DRAIN_TIMEOUT_SECONDS = (30, 0, 86400)
