"""bench/bench_reshape_writes.py counts what it says: a small reshape on the simulation,
every write classified, none to a partition Lease once the group is settled again."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_reshape_writes.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_reshape_writes", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_write_is_classified_by_object_and_verb() -> None:
    kind_of = bench().kind_of
    lock = {"metadata": {"labels": {"kgroup.dev/role": "partition"}}}
    assert kind_of("leases/orders-p-1", None, lock) == "leases(partition) create"
    assert kind_of("leases/orders-p-1", lock, lock) == "leases(partition) update"
    assert kind_of("leases/orders-p-1", lock, None) == "leases(partition) delete"
    group = {"spec": {"partitions": 8}, "status": {"epoch": 1}}
    assert kind_of("consumergroups/orders", group, {**group, "status": {"epoch": 2}}) == \
        "consumergroups status"
    assert kind_of("consumergroups/orders", group, {**group, "spec": {"partitions": 12}}) == \
        "consumergroups update"


def test_a_reshape_writes_successors_and_nothing_to_partition_leases_after_it() -> None:
    out = bench().run(start=16, to=24, members=3, at=20.0, drain=2.0, seed=1,
                      fault_time=40.0)
    assert out["violations"] == [] and out["completed"] == 16
    during = out["phases"]["reshape"]["by_kind"]
    assert during["leases(partition) create"] == 24  # one Lease per successor
    assert during["leases(partition) update"] >= 24 + 16  # acquisitions, completed releases
    after = out["phases"]["after"]
    assert after["seconds"] > 10
    assert not [k for k in after["by_kind"] if k.startswith("leases(partition)")], after
    assert after["by_kind"]["leases(member) update"] > 0  # the renewals go on
