"""The operator's side of the core: planning a group's target, its status, the expiry marks,
the leader election (decisions only; kgroup_operator and kgroup_sim.control run them)."""
