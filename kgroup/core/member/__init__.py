"""The member's side of the core: a sidecar's state machine over its locks, the requests it
makes, the assignment view and readiness (decisions only; kgroup_sidecar and
kgroup_sim.sidecar run them)."""
