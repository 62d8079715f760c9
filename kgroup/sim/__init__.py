"""A deterministic simulation of the whole kgroup protocol, with injected faults.

Rule of this package: pure Python, no I/O, no real clock. It runs the real cores
(``kgroup.core.member`` and ``kgroup.core.locks`` in every simulated sidecar,
``kgroup.core.group`` and ``kgroup.core.status`` in the simulated operator) against a
simulated API store, on simulated clocks that drift, with delayed, lost and replayed
watch events, lost requests and answers, crashes, GC pauses longer than the lease,
network cuts and operator restarts, and checks safety, token order, a fenced sink and
liveness after every event (see :mod:`kgroup.sim.checks`). A seed fully determines a run,
so a failing seed replays: ``python -m kgroup.sim --seed N --verbose``.

Layout: ``kernel`` (time, events, processes), ``store`` (resourceVersions, conflicts),
``sidecar`` and ``control`` (adapters mirroring the real sidecar runtime and operator
controller), ``checks`` (the invariants), ``world`` (one run: faults, watches, verdict),
``variants`` (broken members and a fix candidate).
"""

from kgroup.sim.checks import Violation
from kgroup.sim.world import FAULT_KINDS, Fault, Result, SimConfig, run_seed

__all__ = ["FAULT_KINDS", "Fault", "Result", "SimConfig", "Violation", "run_seed"]
