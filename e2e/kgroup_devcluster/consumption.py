"""Consumption as the fenced sink records it: each partition's committed offset against its
stream's tail, sampled, and the pauses and takeovers read from the samples.

Rule: ownership is not progress. A partition is *paused* while its stream has events past
the committed offset (pending) and that offset does not advance; it is *processed
elsewhere* after a pod leaves once its committed offset advances under a newer token than
the leaving pod's (tokens only grow: a newer token is another owner). The sink's record
(`kgroup_pipeline.fencing`: ``offset`` and ``token`` of ``sink:p:<n>``) and the stream's
last id are all that is read, so the figures hold for any app that commits through the
fenced sink (the light worker or the PySpark job).

:class:`Sampler` (a thread, one Redis pipeline per round) records; the functions below are
pure: samples in, figures out (tests/test_bench_real_node.py).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from kgroup_pipeline.keys import StreamKeys, parse_id

StreamId = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Sample:
    """One partition at one instant (``time.monotonic()``)."""

    t: float
    offset: StreamId | None  # the committed offset; None: never planned
    token: int  # the sink's token: the last owner that planned or committed
    tail: StreamId | None  # the stream's last id; None: no events yet

    @property
    def pending(self) -> bool:
        return self.tail is not None and (self.offset is None or self.tail > self.offset)


Series = Mapping[int, Sequence[Sample]]


def pauses(samples: Sequence[Sample], t0: float, t1: float) -> list[tuple[float, float]]:
    """The stretches within [t0, t1] in which the partition had events pending and its
    committed offset did not advance, as (start, end); one still open at t1 ends there.

    Seen at the sampling interval: a pause starts at the first sample that finds events
    pending after the last advance and ends at the first sample that finds the offset
    advanced, so the gaps between the commits of a running app are pauses too (short).
    An offset appearing where there was none is the first plan (it stores where reading
    starts), not an advance."""
    out: list[tuple[float, float]] = []
    since: float | None = None
    prev: Sample | None = None
    last = t0
    for s in samples:
        if not t0 <= s.t <= t1:
            continue
        if since is not None and advanced(prev, s):
            out.append((since, s.t))
            since = None
        if since is None and s.pending:
            since = s.t
        prev, last = s, s.t
    if since is not None:
        out.append((since, last))
    return out


def advanced(prev: Sample | None, s: Sample) -> bool:
    """Whether the committed offset moved from `prev` to `s` (a first plan's offset is
    not a commit)."""
    return prev is not None and prev.offset is not None and s.offset != prev.offset


def pause_figures(series: Series, t0: float, t1: float) -> dict[str, object]:
    """The longest pause of any partition in [t0, t1], and each partition's longest pause
    (p50 and max over the partitions, and all of them by partition)."""
    longest = {p: max((b - a for a, b in pauses(s, t0, t1)), default=0.0)
               for p, s in sorted(series.items())}
    values = list(longest.values()) or [0.0]
    return {"longest_pause_s": max(values),
            "per_partition_longest_p50_s": statistics.median(values),
            "per_partition_longest_max_s": max(values),
            "per_partition_longest_s": {str(p): round(v, 2) for p, v in longest.items()}}


def processed_elsewhere(samples: Sequence[Sample], t0: float, token: int) -> float | None:
    """Seconds from t0 until the partition's committed offset advanced under a token above
    ``token`` (another, later owner), or None if it never did in the samples.

    The base is the offset of the last sample whose token was not yet above ``token``: a
    last commit of the old owner is not counted, nor a new owner's plan (which raises the
    token before it commits). Both within one sampling interval read as the new owner's
    commit: a figure at most one interval early."""
    base: StreamId | None = None
    for s in samples:
        if s.token <= token:
            base = s.offset
        elif s.t >= t0 and s.offset != base:
            return max(0.0, s.t - t0)
    return None


def committed_under(samples: Sequence[Sample], token: int, until: float) -> bool:
    """Whether the owner with ``token`` planned or committed the partition before
    ``until`` (its app had started consuming it)."""
    return any(s.token == token for s in samples if s.t < until)


def stalled(series: Series, within: float) -> list[int]:
    """Partitions whose last sample has events pending and whose committed offset has not
    advanced for ``within`` s (or ever, over samples that long)."""
    out = []
    for p, samples in sorted(series.items()):
        if not samples or not samples[-1].pending:
            continue
        since = samples[0].t
        for prev, s in itertools.pairwise(samples):
            if advanced(prev, s):
                since = s.t
        if samples[-1].t - since >= within:
            out.append(p)
    return out


class Sampler:
    """Samples every partition's committed offset, token and stream tail every ``period``
    seconds in a thread, until closed."""

    def __init__(self, redis_url: str, stream: str, partitions: int,
                 period: float = 0.2) -> None:
        self.client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.keys = StreamKeys(stream)
        self.partitions, self.period = partitions, period
        self.series: dict[int, list[Sample]] = {p: [] for p in range(partitions)}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def snapshot(self) -> dict[int, list[Sample]]:
        with self._lock:
            return {p: list(s) for p, s in self.series.items()}

    def sample(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.hmget(self.keys.sink_partition(p), ["offset", "token"])
            pipe.xrevrange(self.keys.partition(p), count=1)
        raw = pipe.execute()
        t = time.monotonic()
        with self._lock:
            for p in range(self.partitions):
                (offset, token), tail = raw[2 * p], raw[2 * p + 1]
                self.series[p].append(Sample(t, parse_id(offset) if offset else None,
                                             int(token or 0),
                                             parse_id(tail[0][0]) if tail else None))

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except redis.RedisError as exc:  # Redis stopping at the end: keep what we have
                self.errors.append(str(exc)[:200])
            self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def wait_consuming(self, *, within: float = 10.0, timeout: float = 600.0) -> float:
        """Wait until no partition has been stalled for ``within`` s (every app consuming);
        returns when. Raises TimeoutError naming the stalled partitions."""
        deadline = time.monotonic() + timeout
        time.sleep(within)  # a full look-back window of samples first
        while True:
            now = time.monotonic()
            stuck = stalled(self.snapshot(), within)
            if not stuck:
                return now
            if now > deadline:
                raise TimeoutError(f"partitions {stuck} stalled for {within} s")
            time.sleep(1.0)
