"""A deterministic simulation of the whole kgroup protocol, with injected faults.

Rule of this package: pure Python, no I/O, no real clock. It runs the shipped decision
code (``kgroup.core.member.converge`` with ``kgroup.core.member.reconcile`` in every simulated
sidecar, ``kgroup.core.operator.decide`` in the simulated operator) against a simulated
API store holding wire-form objects, on simulated clocks that drift, with delayed, lost
and replayed watch events, lost requests and answers, crashes, GC pauses longer than the
lease, network cuts and operator restarts (and, when configured, reshapes: changes of
``spec.partitions`` whose sealed partitions the apps read to their seal), and checks
safety, token order, a fenced sink, reshape order and liveness after every event (see
:mod:`kgroup_sim.checks`). A seed fully determines a
run, so a failing seed replays: ``python -m kgroup_sim --seed N --verbose``.

Layout: ``kernel`` (time, events, processes), ``store`` (resourceVersions, conflicts),
``sidecar`` and ``control`` (thin drivers of the shipped decision code, like the real
runtime and controller), ``checks`` (the invariants), ``run`` (one run: watches,
processes, verdict), ``faults`` (process faults, drawn or scripted), ``hand_edits`` (an
admin's edits of the stored objects, the garbage collector), ``variants`` (the shipped
code with one decision broken, to prove the checks fail); ``load`` (load-aware planning
over simulated time: skewed loads, noise, plans on a period; the apps' load reports in a
whole run, with a shift of the hot set, checked by ``checks.OscillationCheck``).
"""

from kgroup_sim.checks import Violation
from kgroup_sim.world import FAULT_KINDS, Fault, Result, SimConfig, run_seed

__all__ = ["FAULT_KINDS", "Fault", "Result", "SimConfig", "Violation", "run_seed"]
