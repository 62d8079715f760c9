"""The pipeline's semantics with the light worker (real redis-server, no JVM)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis
from pipeline_fixtures import rclient, redis_url, stream

from kgroup_pipeline.fencing import FencedStore
from kgroup_pipeline.handoff import HandoffController
from kgroup_pipeline.light_worker import LightWorker
from kgroup_pipeline.ownership import OwnedPartition, StaticOwnership
from kgroup_pipeline.producer import produce
from kgroup_pipeline.range_reader import aggregate, read_range
from kgroup_pipeline.scripted import ScriptedCoordinator
from kgroup_pipeline.verify import main as verify_main
from kgroup_pipeline.verify import verify

__all__ = ["rclient", "redis_url", "stream"]
PARTS = 16


def xrange(client: redis.Redis, key: str, **kw: Any) -> list[tuple[str, dict[str, str]]]:
    return cast("list[tuple[str, dict[str, str]]]", client.xrange(key, **kw))


def wait_for(cond: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def drain(worker: LightWorker, client: redis.Redis, stream: str) -> None:
    def caught_up() -> bool:
        worker.run_once()
        return verify(client, stream).caught_up
    wait_for(caught_up, what="catch-up")


def test_one_worker_consumes_every_partition_and_the_verifier_is_clean(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=PARTS, count=6000, keys=200, bad_every=101, seed=1)
    worker = LightWorker(client=rclient, stream=stream,
                         ownership=StaticOwnership(list(range(PARTS))), max_rows=1000)
    drain(worker, rclient, stream)
    report = verify(rclient, stream)
    assert report.clean and report.caught_up
    assert report.total("committed") == report.total("produced") > 5000
    assert report.total("out_of_order") == 0
    assert report.total("dead") == report.total("bad") > 0


def test_dead_letters_carry_the_reason_and_never_stop_the_job(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=4, count=400, keys=20, bad_every=10, seed=2)
    rclient.xadd(f"kgroup:{{{stream}}}:p:1", {"key": "c00001", "event": "x", "amount": "5",
                                              "seq": "one"})
    worker = LightWorker(client=rclient, stream=stream, ownership=StaticOwnership([0, 1, 2, 3]))
    drain(worker, rclient, stream)
    dead = xrange(rclient, f"kgroup:{{{stream}}}:dead")
    reasons = {fields["reason"].split(":")[0] for _, fields in dead}
    assert reasons == {"missing field", "non-numeric amount", "non-numeric seq"}
    assert len(dead) == 40 + 1
    assert verify(rclient, stream).total("committed") == 360


def test_a_partition_moves_between_two_workers_without_loss_or_duplicate(
        rclient: redis.Redis, stream: str, redis_url: str) -> None:
    coord = ScriptedCoordinator(PARTS)
    coord.assign("a", list(range(PARTS)))
    workers = {m: LightWorker(client=redis.Redis.from_url(redis_url, decode_responses=True),
                              stream=stream, ownership=coord.ownership(m), max_rows=500)
               for m in ("a", "b")}
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers.values()]
    producer = threading.Thread(target=produce,
                                args=(redis.Redis.from_url(redis_url, decode_responses=True),),
                                kwargs={"stream": stream, "partitions": PARTS, "count": 20_000,
                                        "rate": 8000.0, "keys": 300, "seed": 3})
    producer.start()
    for t in threads:
        t.start()
    try:
        wait_for(lambda: verify(rclient, stream).total("committed") > 3000, what="progress")
        coord.move(3, "b")
        coord.move(7, "b")
        wait_for(lambda: coord.holder(3)[0] == "b" and coord.holder(7)[0] == "b",
                 what="handoff")
        producer.join()
        wait_for(lambda: verify(rclient, stream).caught_up, what="catch-up")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    report = verify(rclient, stream)
    assert report.clean, report
    assert report.total("committed") == 20_000
    assert report.total("out_of_order") == 0
    released = {(m, p, tok) for m, p, tok, _ in coord.releases}
    assert {("a", 3, 1), ("a", 7, 1)} <= released
    sink3 = rclient.hgetall(f"kgroup:{{{stream}}}:sink:p:3")
    assert sink3["token"] == "2"  # b wrote partition 3 under the new token
    assert int(rclient.hget(f"kgroup:{{{stream}}}:sink:p:0", "token") or 0) == 1


def test_a_zombie_write_with_a_stale_token_is_refused_and_counted(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=2, count=500, keys=10, seed=4)
    store = FencedStore(rclient, stream)
    coord = ScriptedCoordinator(2)
    coord.assign("a", [0, 1])
    # a plans and reads partition 0 under token 1 ... and stalls before committing.
    (plan,) = store.plan([OwnedPartition(0, 1)], max_rows=10_000)
    stale = aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                 from_id=plan.from_id, to_id=plan.to_id,
                                 limit=plan.limit))
    coord.expire("a")  # its session lapsed; the lock goes to b with token 2
    coord.assign("b", [0, 1])
    assert coord.holder(0) == ("b", 2)
    b = LightWorker(client=rclient, stream=stream, ownership=coord.ownership("b"))
    drain(b, rclient, stream)
    before = store.committed(0)
    (outcome,) = store.commit(stale)
    assert outcome.status == "stale-token"
    assert store.refused() == (1, 0)
    assert store.committed(0)["offset"] == before["offset"]
    assert store.committed(0)["events"] == before["events"]
    report = verify(rclient, stream)
    assert report.clean and report.zombie_refused == 1


def test_a_replayed_range_is_refused_and_a_gap_is_refused(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=1, count=100, keys=5, seed=5)
    store = FencedStore(rclient, stream)
    (plan,) = store.plan([OwnedPartition(0, 1)], max_rows=60)
    first = aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                 from_id=plan.from_id, to_id=plan.to_id,
                                 limit=plan.limit))
    assert [o.status for o in store.commit(first)] == ["committed"]
    assert [o.status for o in store.commit(first)] == ["offset-mismatch"]  # replay
    (plan2,) = store.plan([OwnedPartition(0, 1)], max_rows=60)
    assert plan2.from_id == first[0].to_id and plan2.rows == 40
    entries = xrange(rclient, f"kgroup:{{{stream}}}:p:0", min="(" + plan2.from_id, count=20)
    skipping = aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                    from_id=entries[-1][0], to_id=plan2.to_id))
    assert [o.status for o in store.commit(skipping)] == ["offset-mismatch"]  # a gap
    assert store.refused() == (0, 2)
    assert int(store.committed(0)["events"]) == 60


def test_the_sink_offset_wins_over_the_handed_position_and_sealed_partitions_are_not_planned(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=1, count=50, keys=5, seed=6)
    store = FencedStore(rclient, stream)
    ids = [i for i, _ in xrange(rclient, f"kgroup:{{{stream}}}:p:0")]
    # Never seen by the sink: start after the handed-over position.
    (plan,) = store.plan([OwnedPartition(0, 1, position=ids[9])], max_rows=1000)
    assert plan.from_id == ids[9]
    (res,) = aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                  from_id=plan.from_id, to_id=plan.to_id, limit=plan.limit))
    assert (res.events, res.to_id) == (40, ids[-1])
    # Known to the sink: its committed offset wins over a handed position.
    (plan,) = store.plan([OwnedPartition(0, 2, position=ids[0])], max_rows=1000)
    assert plan.from_id == ids[9]
    seal = store.seal(0, 2)
    assert seal.status == "sealed" and not seal.drained  # the range above is not committed
    (plan,) = store.plan([OwnedPartition(0, 2)], max_rows=1000)
    assert plan.status == "sealed"
    (plan,) = store.plan([OwnedPartition(0, 1)], max_rows=1000)
    assert plan.status == "fenced"


def test_the_verifier_reports_duplicates_and_losses(
        rclient: redis.Redis, stream: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    produce(rclient, stream=stream, partitions=2, count=300, keys=10, seed=7)
    worker = LightWorker(client=rclient, stream=stream, ownership=StaticOwnership([0, 1]))
    drain(worker, rclient, stream)
    assert verify_main(["--redis", redis_url, "--stream", stream]) == 0
    key = next(iter(rclient.hgetall(f"kgroup:{{{stream}}}:sink:count:0")))
    rclient.hincrby(f"kgroup:{{{stream}}}:sink:count:0", key, 1)
    assert verify(rclient, stream).total("duplicated") == 1
    rclient.hincrby(f"kgroup:{{{stream}}}:sink:count:0", key, -3)
    assert verify(rclient, stream).total("lost") == 2
    assert verify_main(["--redis", redis_url, "--stream", stream]) == 1


def test_a_revoked_partition_is_released_only_after_its_last_planned_batch_commits(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=2, count=400, keys=10, seed=8)
    store = FencedStore(rclient, stream)
    coord = ScriptedCoordinator(2)
    coord.assign("a", [0, 1])
    handoff = HandoffController(coord.ownership("a"), store, drain_timeout=30.0)
    (plan,) = store.plan([OwnedPartition(0, 1)], max_rows=100)  # a batch in flight
    coord.move(0, "b")
    assert handoff.step(now=0.0) == []  # still in flight: no release
    assert coord.holder(0) == ("a", 1)
    # The planner read "active" a moment before the seal: its plan is refused now.
    assert store.plan([OwnedPartition(0, 1)], max_rows=100)[0].status == "sealed"
    in_flight = aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                     from_id=plan.from_id, to_id=plan.to_id, limit=plan.limit))
    assert in_flight[0].events == 100  # the plan's limit, not the whole stream
    assert [o.status for o in store.commit(in_flight)] == ["committed"]
    assert handoff.step(now=1.0) == [0]
    end = in_flight[0].to_id
    assert coord.releases == [("a", 0, 1, end)]
    assert coord.holder(0) == ("b", 2)
    (b_plan,) = store.plan([OwnedPartition(0, 2, position=end)], max_rows=1000)
    assert b_plan.status == "ok" and b_plan.from_id == end


def test_a_batch_that_never_commits_is_released_at_the_committed_offset_after_the_timeout(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=1, count=100, keys=5, seed=9)
    store = FencedStore(rclient, stream)
    coord = ScriptedCoordinator(1)
    coord.assign("a", [0])
    handoff = HandoffController(coord.ownership("a"), store, drain_timeout=5.0)
    store.plan([OwnedPartition(0, 1)], max_rows=50)  # planned, then the batch is lost
    coord.move(0, "b")
    assert handoff.step(now=100.0) == []
    assert handoff.step(now=104.9) == []
    assert handoff.step(now=105.0) == [0]
    assert coord.releases == [("a", 0, 1, "0-0")]  # nothing was committed


def test_resource_version_tokens_fence_above_the_leasetransitions_era(
        rclient: redis.Redis, stream: str) -> None:
    """Tokens are resourceVersions now (kgroup.core.tokens): far above the old
    leaseTransitions tokens a sink may hold, so an upgrade goes forwards; the sink's Lua
    compares them exactly (doubles: exact below 2**53)."""
    produce(rclient, stream=stream, partitions=1, count=50, keys=5, seed=6)
    store = FencedStore(rclient, stream)
    (old,) = store.plan([OwnedPartition(0, 3)], max_rows=10)  # a leaseTransitions token
    assert store.commit(aggregate(read_range(rclient, stream=stream, partition=0, token=3,
                                             from_id=old.from_id, to_id=old.to_id,
                                             limit=old.limit)))[
        0].status == "committed"
    high = 2**52 + 1  # an etcd revision (in practice ~1e6-1e10)
    (new,) = store.plan([OwnedPartition(0, high)], max_rows=10)
    assert rclient.hget(f"kgroup:{{{stream}}}:sink:p:0", "token") == str(high)
    (zombie,) = store.plan([OwnedPartition(0, high - 1)], max_rows=10)
    assert zombie.status == "fenced"  # one below is refused: exact
    batch = aggregate(read_range(rclient, stream=stream, partition=0, token=high,
                                 from_id=new.from_id, to_id=new.to_id,
                                 limit=new.limit))
    assert store.commit(batch)[0].status == "committed"


def reference(entries: list[tuple[str, dict[str, str]]]) -> tuple[dict[str, tuple[int, ...]],
                                                                  list[tuple[str, str]]]:
    """Per key (count, total, first, last, gaps) and the dead letters (id, reason), one event
    at a time in plain Python: what the columnar read + aggregation must reproduce."""
    keys: dict[str, list[int]] = {}
    dead: list[tuple[str, str]] = []
    for eid, f in entries:
        try:
            if not f.get("key") or "event" not in f:
                raise ValueError
            amount, seq = int(f["amount"]), int(f["seq"])
        except (KeyError, ValueError):
            dead.append((eid, "?"))
            continue
        k = keys.setdefault(f["key"], [0, 0, seq, seq, 0])
        k[4] += k[0] > 0 and seq != k[3] + 1
        k[0], k[1], k[3] = k[0] + 1, k[1] + amount, seq
    return {k: tuple(v) for k, v in keys.items()}, dead


@pytest.mark.parametrize(("odd_every", "chunk"), [(0, 700), (7, 700), (7, 5)])
def test_the_columnar_read_and_aggregation_match_a_plain_python_fold(
        rclient: redis.Redis, stream: str, odd_every: int, chunk: int) -> None:
    """The fast path cuts columns out of whole chunks; any odd entry (fields in another
    order, hex or padded numbers, an empty key, non-UTF-8, a missing field) sends its chunk
    down the per-entry path. Both must give what a plain fold gives, gaps included."""
    produce(rclient, stream=stream, partitions=1, count=3000, keys=30, bad_every=0, seed=21)
    name = f"kgroup:{{{stream}}}:p:0"
    odd: list[dict[str, str | bytes]] = [
        {"seq": "1", "amount": "5", "event": "x", "key": "reordered"},
        {"key": "hex", "amount": "0x1", "event": "x", "seq": "1"},
        {"key": "pad", "amount": " 4", "event": "x", "seq": "1"},
        {"key": "", "amount": "1", "event": "x", "seq": "1"},
        {"key": b"\xff\xfe", "amount": "1", "event": "x", "seq": "1"},
        {"key": "noseq", "amount": "1", "event": "x"},
        {"key": "c00003", "amount": "2", "event": "x", "seq": "999"},  # a gap for c00003
        {"key": "extra", "amount": "2", "event": "x", "seq": "1", "more": "y"},
    ]
    for i, fields in enumerate(odd if odd_every else []):
        rclient.xadd(name, fields)  # type: ignore[arg-type]
        produce(rclient, stream=stream, partitions=1, count=odd_every * (i + 1), keys=30,
                seed=22 + i)
    produce(rclient, stream=stream, partitions=1, count=500, keys=30, seed=40)
    raw = redis.Redis(connection_pool=redis.ConnectionPool(
        **{**rclient.connection_pool.connection_kwargs, "decode_responses": False}))
    stored = cast("list[tuple[bytes, dict[bytes, bytes]]]", raw.xrange(name))
    entries = [(i.decode(), {k.decode(): v.decode(errors="replace") for k, v in f.items()})
               for i, f in stored]
    want_keys, want_dead = reference(entries)
    (res,) = aggregate(read_range(rclient, stream=stream, partition=0, token=1, from_id="0-0",
                                  to_id=entries[-1][0], chunk=chunk))
    got = {k.key: (k.count, k.total, k.first_seq, k.last_seq, k.gaps) for k in res.keys}
    assert got == want_keys
    assert [(d.id, "?") for d in res.dead] == want_dead
    assert res.events == len(entries) and res.to_id == entries[-1][0]
    assert [k.key for k in res.keys] == sorted(want_keys)
    if odd_every:
        assert want_keys["c00003"][4] >= 1 and len(want_dead) == 3  # hex, empty key, no seq


def test_a_limit_cuts_the_range_and_a_second_read_sees_the_same_rows(
        rclient: redis.Redis, stream: str) -> None:
    produce(rclient, stream=stream, partitions=1, count=1000, keys=10, seed=23)
    store = FencedStore(rclient, stream)
    (plan,) = store.plan([OwnedPartition(0, 1)], max_rows=300)
    assert plan.rows == plan.limit == 300
    ids = [i for i, _ in xrange(rclient, f"kgroup:{{{stream}}}:p:0")]
    assert plan.to_id == ids[-1]  # the bound; the limit cuts the read at the 300th entry
    produce(rclient, stream=stream, partitions=1, count=200, keys=10, seed=24)  # arrives later
    first, again = (aggregate(read_range(rclient, stream=stream, partition=0, token=1,
                                         from_id=plan.from_id, to_id=plan.to_id,
                                         limit=plan.limit, chunk=128)) for _ in range(2))
    assert first == again and first[0].events == 300 and first[0].to_id == ids[299]
