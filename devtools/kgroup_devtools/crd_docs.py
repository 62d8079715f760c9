"""What ``kubectl explain consumergroup`` says: one description per CRD field, with units
and defaults, merged into the generated schema by :mod:`kgroup_devtools.crdgen` (after its own
overlay, so the texts here win). A field without an entry here fails
``tests/test_crd_docs.py``; a path here that names no field fails ``make crd``.

``metadata`` is the API server's ObjectMeta (it forbids any schema of ours there, and
publishes ObjectMeta's own descriptions). Paths as in the crdgen overlay: ``a.b`` steps
into properties, ``x[]`` into list items, ``x{}`` into map values. Extra schema keys
(``format``) may ride along.
"""

from __future__ import annotations

from typing import Any

_RANGES = ("compact partition ranges, e.g. \"0-3,7,9-12\" (sorted, runs of consecutive "
           "partitions folded into a-b)")
_TIMESTAMP = "RFC 3339 UTC timestamp"

DESCRIPTIONS: dict[str, dict[str, Any]] = {
    "apiVersion": {"description": "kgroup.dev/v1alpha1."},
    "kind": {"description": "ConsumerGroup."},
    # ---- spec -------------------------------------------------------------------------
    "spec": {"description": "What the group consumes and how its partitions are assigned "
                            "to member pods. Written by you; read by the operator and the "
                            "sidecars."},
    "spec.partitions": {"description": "Number of partitions; 1 to 100000. What a change "
                                       "does is spec.reshape.policy's: Generations (up or "
                                       "down) makes a new generation of partitions by "
                                       "key-hash ranges, each assigned only once the "
                                       "partitions it replaces are read to their end "
                                       "(status.layout); Append only grows, the new "
                                       "partitions assigned at once. Required."},
    "spec.selector": {"description": "The member pods: a label selector "
                                     "(metav1.LabelSelector) that must select something. "
                                     "Required."},
    "spec.selector.matchLabels": {"description": "Labels a member pod must carry (all of "
                                                 "them); at most 64. Default: none."},
    "spec.selector.matchLabels{}": {"description": "The label's value."},
    "spec.selector.matchExpressions": {"description": "Set-based requirements a member pod "
                                                      "must meet (all of them); at most 64. "
                                                      "Default: none."},
    "spec.selector.matchExpressions[]": {"description": "One requirement: key, operator, "
                                                        "values."},
    "spec.selector.matchExpressions[].key": {"description": "The label key."},
    "spec.selector.matchExpressions[].operator": {
        "description": "In, NotIn, Exists or DoesNotExist."},
    "spec.selector.matchExpressions[].values": {
        "description": "The values for In and NotIn (at most 256); empty for Exists and "
                       "DoesNotExist. Default: none."},
    "spec.selector.matchExpressions[].values[]": {"description": "One label value."},
    "spec.assignor": {"description": "How the target assignment is computed: sticky (moves "
                                     "as few partitions as a balanced assignment allows) or "
                                     "range (contiguous blocks by member name). Default: "
                                     "sticky."},
    "spec.stabilizationWindowSeconds": {
        "description": "Seconds that batch joins: the first join after this long without "
                       "one acts at once, later joins wait until no member joined for this "
                       "long (leaves act at once); 0 to 3600. Default: 5."},
    "spec.stabilizationMaxDelaySeconds": {
        "description": "Seconds after the first membership change by which a rebalance "
                       "happens even if changes keep coming; 0 to 86400. Default: 30."},
    "spec.lease": {"description": "The session lease of each member (its member Lease); "
                                  "renewIntervalSeconds must be less than durationSeconds."},
    "spec.lease.durationSeconds": {
        "description": "Seconds a member's session stays valid without a renewal; a crashed "
                       "pod's partitions are taken over after it. 2 to 3600. Default: 8."},
    "spec.lease.renewIntervalSeconds": {
        "description": "Seconds between renewals of a member's session (one API write "
                       "each); 1 to 3600. Default: 2."},
    "spec.handoff": {"description": "How a revoked partition is handed over."},
    "spec.handoff.drainTimeoutSeconds": {
        "description": "Seconds a revoking partition waits for the application to finish "
                       "its in-flight work and release it; after that the sidecar releases "
                       "it without a position. 0 to 86400. Default: 30."},
    "spec.restartGraceSeconds": {
        "description": "Seconds a member that comes back under the same pod name keeps its "
                       "partitions (a pod still there or a bare pod; a Deployment's pod once "
                       "terminating never comes back and gets none); 0 to 86400. "
                       "Default: 0 (off)."},
    "spec.statefulSetRestartGraceSeconds": {
        "description": "The same grace for the pods of a StatefulSet (the larger of this and "
                       "restartGraceSeconds applies): a rollout restart of a StatefulSet moves "
                       "no partition; a pod beyond the StatefulSet's replicas (scaled down) "
                       "gets none; 0 to 86400. Default: 30."},
    "spec.paused": {"description": "true freezes the target assignment (no rebalance); "
                                   "owners keep what they hold. Default: false."},
    "spec.balance": {"description": "What the assignment balances: partition counts, or the "
                                    "load the apps report (docs/load-balancing.md)."},
    "spec.balance.mode": {
        "description": "count: every partition weighs the same (the assignor's balance); "
                       "load: partitions move so that the busiest member's reported "
                       "events/s comes near the mean, with hysteresis. Default: count."},
    "spec.balance.tolerance": {
        "description": "mode load: a rebalance brings the busiest member to at most "
                       "(1 + tolerance) x the mean, or the best any assignment can do; "
                       "0 to 10. Default: 0.15."},
    "spec.balance.margin": {
        "description": "mode load: the dead zone above the tolerance; nothing moves while "
                       "the busiest member is at most (1 + tolerance + margin) x the mean, "
                       "and a rebalance must lower it by more than margin x the mean; 0 to "
                       "10. Default: 0.05."},
    "spec.balance.dwellSeconds": {
        "description": "mode load: seconds after its last move during which a partition "
                       "does not move again for load; 0 to 86400. Default: 60."},
    "spec.balance.countSlack": {
        "description": "mode load: a member holds at most ceil(countSlack x its fair "
                       "count) partitions, so partitions without load do not pile up on "
                       "one member; 1 to 1000. Default: 2."},
    "spec.sizing": {"description": "How the group's recommended size (status.load."
                                   "recommendedMembers) is computed."},
    "spec.sizing.catchUpSeconds": {
        "description": "Seconds within which the recommended members should work off the "
                       "present backlog while keeping up with the input: members = "
                       "ceil((rate + lag / catchUpSeconds) / one member's measured "
                       "capacity); 1 to 86400. Default: 300."},
    "spec.reshape": {"description": "What a change of spec.partitions does "
                                    "(docs/reshape.md)."},
    "spec.reshape.policy": {
        "description": "Generations: a change (up or down) is a reshape that keeps each "
                       "key's order: new partitions (new numbers) take key-hash ranges and "
                       "wait until the partitions they replace are read to their seal; "
                       "for producers that follow status.layout (kgroup.producer). "
                       "Append: growth only, partitions N..M-1 added and assigned at "
                       "once, keys re-hashed by crc32 % partitions (a key's new events may "
                       "be read before its old ones); shrinking is refused, and so is a "
                       "change once status.layout is not one modulo generation (after a "
                       "Generations reshape). "
                       "Default: Generations."},
    "spec.reshape.change": {
        "description": "Optional: one split or one merge of the newest generation's key-hash "
                       "ranges, under policy Generations (docs/reshape.md, \"Splits and "
                       "merges\"). Applied once, when status.layout's newest generation is "
                       "generation - 1; set spec.partitions in the same change to the count "
                       "it leaves (one more after a split, one fewer after a merge). The "
                       "group's first reshape must be a change of spec.partitions (a uniform "
                       "one): a modulo generation has no ranges to cut."},
    "spec.reshape.change.generation": {
        "description": "The generation this change makes (2 or more): it applies once, when "
                       "the newest generation is the one before, and is then kept as history."},
    "spec.reshape.change.split": {
        "description": "A partition of the newest generation whose key-hash range is cut "
                       "into two halves: two new partitions succeed it."},
    "spec.reshape.change.merge": {
        "description": "Two partitions of the newest generation with adjacent key-hash "
                       "ranges: one new partition succeeds both."},
    "spec.reshape.change.merge[]": {"description": "A partition number."},
    "spec.autoscaling": {
        "description": "Optional: the operator sets the replicas of a Deployment or "
                       "StatefulSet of this namespace to status.load.recommendedMembers "
                       "within [minMembers, maxMembers], through its scale subresource: up "
                       "at once, down only after the recommendation stayed low for "
                       "scaleDownDelaySeconds, one change at a time, none while the group "
                       "rebalances (docs/load-balancing.md, \"Autoscaling\"). Absent: the "
                       "operator never scales."},
    "spec.autoscaling.minMembers": {"description": "Fewest replicas it sets; 1 to 100000, "
                                                   "at most maxMembers. Default: 1."},
    "spec.autoscaling.maxMembers": {"description": "Most replicas it sets; 1 to 100000, "
                                                   "at most spec.partitions. Required."},
    "spec.autoscaling.scaleTargetRef": {
        "description": "The workload whose replicas are set, in the group's namespace (as "
                       "an HorizontalPodAutoscaler's scaleTargetRef). Do not point an HPA "
                       "at it as well."},
    "spec.autoscaling.scaleTargetRef.apiVersion": {"description": "apps/v1. Default: "
                                                                  "apps/v1."},
    "spec.autoscaling.scaleTargetRef.kind": {"description": "Deployment or StatefulSet. "
                                                            "Required."},
    "spec.autoscaling.scaleTargetRef.name": {"description": "Its name. Required."},
    "spec.autoscaling.scaleDownDelaySeconds": {
        "description": "Replicas go down only once every recommendation of this many "
                       "seconds was low enough, and then to the largest of them; 0 to "
                       "86400. Default: 300."},
    "spec.autoscaling.scaleDownTolerance": {
        "description": "Replicas go down only when the recommendations of the delay are "
                       "all at most replicas / (1 + scaleDownTolerance): noise whose "
                       "largest figure is within this factor of its smallest never scales "
                       "down (0.5 covers +-20 %); 0 to 10. Default: 0.5."},
    "spec.source": {"description": "Opaque to kgroup: each worker's app reads it as is "
                                   "from its sidecar (GET /v1/group): stream name, Redis "
                                   "URL, ... Default: {}."},
    # ---- status -----------------------------------------------------------------------
    "status": {"description": "Written by the operator only, through the status "
                              "subresource."},
    "status.observedGeneration": {"description": "The metadata.generation of the spec this "
                                                 "status was computed from."},
    "status.epoch": {"description": "The target assignment's epoch: bumped only when the "
                                    "target changes. 0 or absent: no target yet."},
    "status.phase": {"description": "Pending (no member), Rebalancing (the target is not yet "
                                    "held and acknowledged), Stable, Degraded (partitions "
                                    "unowned too long, a partition stalled, or another "
                                    "problem: see the Degraded condition) or Paused."},
    "status.memberCount": {"description": "Member pods: running, ready (app containers) "
                                          "and in session. Default: 0."},
    "status.unowned": {"description": "Partitions with no live holder. Default: 0."},
    "status.stalled": {"description": "Partitions whose owner's application reports that "
                                      "it cannot make progress (its sink refused its token, "
                                      "or no progress with a lag), as carried by the "
                                      "member Leases' kgroup.dev/health annotation. "
                                      "Default: 0."},
    "status.stalledPartitions": {"description": f"The stalled partitions, as {_RANGES}. "
                                                "Default: empty."},
    "status.assignment": {"description": "The target assignment: member (pod name) -> its "
                                         f"partitions, as {_RANGES}."},
    "status.assignment{}": {"description": f"The member's target partitions, as {_RANGES}."},
    "status.members": {"description": "One row per member (in the target or in session)."},
    "status.members[]": {"description": "A member's target, what it holds and the epoch it "
                                        "acknowledged."},
    "status.members[].name": {"description": "The member's pod name."},
    "status.members[].assigned": {"description": f"Its target partitions, as {_RANGES}."},
    "status.members[].assignedCount": {"description": "Number of target partitions."},
    "status.members[].ownedCount": {"description": "Partition locks its live session holds."},
    "status.members[].acknowledgedEpoch": {
        "description": "The last epoch whose target it held entirely (its member Lease's "
                       "kgroup.dev/epoch); 0: none yet."},
    "status.members[].load": {
        "description": "Events/s its app reports processing on the partitions it holds "
                       "(the member Lease's kgroup.dev/load); absent: not reported."},
    "status.load": {"description": "The group's load as its apps report it (rate and lag "
                                   "per partition, carried on the member Leases' "
                                   "renewals), refreshed at most every 30 s; absent while "
                                   "no app reports a rate (docs/design.md, \"Load\")."},
    "status.load.rate": {"description": "Events/s processed, the whole group."},
    "status.load.arrival": {
        "description": "Events/s arriving, the whole group: each member's processed rate "
                       "plus its lag's growth since the last figures (negative while a "
                       "backlog drains); what recommendedMembers sizes for. Absent: not "
                       "measured yet."},
    "status.load.lag": {"description": "Events behind, the whole group (the sum of what "
                                       "each member reports)."},
    "status.load.busiestOverMean": {
        "description": "The busiest member's rate over the mean member's: 1 is perfect "
                       "balance."},
    "status.load.bound": {
        "description": "The lowest busiestOverMean any assignment of these partitions to "
                       "these members can reach (a hot partition alone may exceed a "
                       "member's share)."},
    "status.load.recommendedMembers": {
        "description": "Members needed to keep up with the arrival rate and work off the lag "
                       "within spec.sizing.catchUpSeconds, at one member's capacity as "
                       "measured; never more than the partitions, and rounded up to a count "
                       "whose busiest member keeps up. Absent: no capacity measured "
                       "yet, or a member is behind and what arrives is not measured yet "
                       "(the first figures)."},
    "status.load.capacity": {
        "description": "Events/s one member is taken to process: the largest rate of a "
                       "member that is behind, else the larger of the busiest member's "
                       "rate and the capacity used before (so the recommendation can "
                       "fall when the input does)."},
    "status.autoscaling": {"description": "What spec.autoscaling did last; absent without "
                                          "spec.autoscaling."},
    "status.autoscaling.desiredMembers": {
        "description": "The last recommendation within spec.autoscaling's bounds: the "
                       "replicas it would set if nothing held it back."},
    "status.autoscaling.replicas": {"description": "The target's replicas as last read "
                                                   "through its scale subresource."},
    "status.autoscaling.lastScaleTime": {
        "description": f"When it last set the replicas ({_TIMESTAMP}).",
        "format": "date-time"},
    "status.autoscaling.reason": {"description": "The last change: from -> to replicas, "
                                                 "and why."},
    "status.autoscaling.lastScaleReplicas": {
        "description": "The replicas the last change set (no other change until the "
                       "group has as many members, or 300 s passed)."},
    "status.autoscaling.scaleDownSince": {
        "description": f"Since when every recommendation has been below scaleDownFrom / "
                       f"(1 + scaleDownTolerance): the scale-down delay runs from then "
                       f"({_TIMESTAMP}, to the microsecond); absent: no scale-down is "
                       f"coming. Kept so that an operator that restarts resumes the delay.",
        "format": "date-time"},
    "status.autoscaling.scaleDownTo": {
        "description": "The largest of those recommendations: the replicas a scale-down "
                       "would set."},
    "status.autoscaling.scaleDownFrom": {
        "description": "The replicas those recommendations were below."},
    "status.autoscaling.scaleUpSeen": {
        "description": f"When the latest recommendation, above scaleUpFrom, was taken: a "
                       f"scale-up waits for the next one to be above too ({_TIMESTAMP}, "
                       f"to the microsecond); absent: no scale-up is pending. Kept so that "
                       f"an operator that restarts does not wait for two more.",
        "format": "date-time"},
    "status.autoscaling.scaleUpTo": {
        "description": "That recommendation: the replicas a scale-up would set, if the "
                       "next one is as high."},
    "status.autoscaling.scaleUpFrom": {
        "description": "The replicas that recommendation was above."},
    "status.load.measuredAt": {"description": f"When these figures were taken "
                                              f"({_TIMESTAMP}).", "format": "date-time"},
    "status.lastRebalance": {"description": "The last change of the target assignment."},
    "status.lastRebalance.epoch": {"description": "The epoch the rebalance produced."},
    "status.lastRebalance.reason": {"description": "Why it happened (member joined, left, "
                                                   "partitions added, ...)."},
    "status.lastRebalance.moved": {"description": "Partitions whose target owner changed "
                                                  "(a newly assigned one counts)."},
    "status.lastRebalance.startedAt": {"description": f"When it started ({_TIMESTAMP}).",
                                       "format": "date-time"},
    "status.lastRebalance.completedAt": {
        "description": f"When every member held and acknowledged the new target "
                       f"({_TIMESTAMP}); absent while in progress.", "format": "date-time"},
    "status.lastRebalance.durationSeconds": {"description": "completedAt - startedAt, in "
                                                            "seconds."},
    "status.sidecarMissing": {"description": "Running pods labelled kgroup.dev/group with "
                                             "this group that have no kgroup sidecar "
                                             "container (they take no part in the group); "
                                             "absent when there is none."},
    "status.sidecarMissing.count": {"description": "How many such pods."},
    "status.sidecarMissing.pods": {"description": "The first of them by name (at most 10)."},
    "status.sidecarMissing.pods[]": {"description": "A pod name."},
    "status.conditions": {"description": "Ready, Rebalancing, Degraded, Stalled, "
                                         "Reconciling and SidecarMissing, by the "
                                         "Kubernetes API conventions; "
                                         "Reconciling and Stalled as kstatus reads them "
                                         "(docs/troubleshooting.md, docs/operations.md)."},
    "status.conditions[]": {"description": "One condition."},
    "status.conditions[].type": {"description": "Ready, Rebalancing, Degraded, Stalled, "
                                                "Reconciling or SidecarMissing."},
    "status.conditions[].status": {"description": "True, False or Unknown."},
    "status.conditions[].reason": {"description": "A CamelCase reason, for programs."},
    "status.conditions[].message": {"description": "What is going on, for people. "
                                                   "Default: empty."},
    "status.conditions[].lastTransitionTime": {
        "description": f"When status last changed ({_TIMESTAMP}).", "format": "date-time"},
    "status.conditions[].observedGeneration": {
        "description": "The metadata.generation this condition was computed from."},
    "status.layout": {"description": "The partition lineage, written by the operator: "
                                     "generations of key-hash layouts and each partition's "
                                     "state (docs/reshape.md). Absent: partitions "
                                     "0..spec.partitions-1, a key in crc32 % partitions."},
    "status.layout.generation": {"description": "The newest generation's number."},
    "status.layout.nextPartition": {"description": "The number the next new partition "
                                                   "gets: numbers are never reused."},
    "status.layout.generations": {"description": "The kept generations, oldest first (at "
                                                 "most 8)."},
    "status.layout.generations[]": {"description": "One generation."},
    "status.layout.generations[].generation": {"description": "Its number."},
    "status.layout.generations[].placement": {"description": "modulo (crc32 % N, the first "
                                                             "generation only) or range "
                                                             "(contiguous hash ranges)."},
    "status.layout.generations[].partitions": {"description": "Its partitions in hash "
                                                              "order, runs folded (4-7)."},
    "status.layout.generations[].widths": {"description": "Range placement: each "
                                                          "partition's share of the hash "
                                                          "space (1/8*8: eight eighths)."},
    "status.layout.states": {"description": "The partitions by state, as partition ranges."},
    "status.layout.states.open": {"description": "In the newest generation: written to."},
    "status.layout.states.sealed": {"description": "Replaced by a reshape, not yet read to "
                                                   "its end."},
    "status.layout.states.completed": {"description": "Replaced and read to its end: its "
                                                      "successors no longer wait for it."},
}
