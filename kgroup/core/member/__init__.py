"""The member's side of the core: a sidecar's state machine over its locks, the requests it
makes and readiness (decisions only; kgroup_sidecar and kgroup_sim.sidecar run them). The
view it renders for the app is shared with the client: :mod:`kgroup.core.assignment`."""
