"""Reading a planned range of one partition, and turning it into per-key results.

Rule: the Spark job and the light worker share these functions, so they compute the same
output for the same range. A range is ``(from, to]`` in stream ids: exclusive of ``from``
(the committed offset), inclusive of ``to`` (the planned end), and never beyond ``to``
even when more events have arrived since the batch was planned.

A malformed event (a field missing, a non-numeric amount or seq) becomes a dead letter
with its reason; it counts as read (the offset moves past it) and never stops the job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import redis

from kgroup_pipeline.keys import StreamKeys

# The rows the source yields: one per event (``from_id``/``to_id`` null; ``id``, ``error``,
# ``raw`` set only for a malformed one — every byte here crosses the JVM twice), then one
# marker row per range (``from_id``/``to_id`` set, ``seq`` = events read) closing it: a
# range whose events all vanished (trimmed) still reaches the sink and moves the offset.
SOURCE_SCHEMA = pa.schema([
    ("partition", pa.int32()), ("token", pa.int64()), ("from_id", pa.string()),
    ("to_id", pa.string()), ("id", pa.string()), ("key", pa.string()),
    ("amount", pa.int64()), ("seq", pa.int64()), ("error", pa.string()), ("raw", pa.string()),
])
SOURCE_DDL = ("partition INT, token BIGINT, from_id STRING, to_id STRING, id STRING, "
              "key STRING, amount BIGINT, seq BIGINT, error STRING, raw STRING")

# The rows the per-partition aggregation yields: kind 'part' (one per range, count = events
# read), 'key' (one per key), 'dead' (one per malformed event; key holds its stream id).
RESULT_SCHEMA = pa.schema([
    ("kind", pa.string()), ("partition", pa.int32()), ("token", pa.int64()),
    ("from_id", pa.string()), ("to_id", pa.string()), ("key", pa.string()),
    ("count", pa.int64()), ("total", pa.int64()), ("first_seq", pa.int64()),
    ("last_seq", pa.int64()), ("gaps", pa.int64()), ("reason", pa.string()), ("raw", pa.string()),
])
RESULT_DDL = ("kind STRING, partition INT, token BIGINT, from_id STRING, to_id STRING, "
              "key STRING, count BIGINT, total BIGINT, first_seq BIGINT, last_seq BIGINT, "
              "gaps BIGINT, reason STRING, raw STRING")


@dataclass(frozen=True)
class KeyResult:
    key: str
    count: int
    total: int
    first_seq: int
    last_seq: int
    gaps: int  # adjacent events of the key, in stream order, whose seq is not last+1


@dataclass(frozen=True)
class DeadLetter:
    id: str
    reason: str
    raw: str


@dataclass
class PartitionResult:
    """The output of one planned range of one partition: what the sink commits at once."""

    partition: int
    token: int
    from_id: str
    to_id: str
    events: int = 0
    keys: list[KeyResult] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)


def _parse(fields: Any) -> tuple[str | None, int | None, int | None, str | None]:
    """(key, amount, seq, error) of one entry."""
    key = fields.get("key")
    if not key:
        return None, None, None, "missing field: key"
    if "event" not in fields:
        return key, None, None, "missing field: event"
    if "amount" not in fields:
        return key, None, None, "missing field: amount"
    try:
        amount = int(fields["amount"])
    except ValueError:
        return key, None, None, f"non-numeric amount: {fields['amount'][:40]!r}"
    if "seq" not in fields:
        return key, None, None, "missing field: seq"
    try:
        seq = int(fields["seq"])
    except ValueError:
        return key, None, None, f"non-numeric seq: {fields['seq'][:40]!r}"
    return key, amount, seq, None


def read_range(
    client: redis.Redis, *, stream: str, partition: int, token: int, from_id: str, to_id: str,
    chunk: int = 5000,
) -> Iterator[pa.RecordBatch]:
    """The events of ``(from_id, to_id]`` of one partition as RecordBatches (SOURCE_SCHEMA)."""
    name = StreamKeys(stream).partition(partition)
    cursor = from_id
    read = 0
    while cursor != to_id:
        entries: Any = client.xrange(name, min="(" + cursor, max=to_id, count=chunk)
        if not entries:
            break
        keys: list[str | None] = []
        amounts: list[int | None] = []
        seqs: list[int | None] = []
        bad: dict[int, tuple[str, str, str]] = {}
        for entry_id, fields in entries:
            key: str | None
            amount: int | None
            seq: int | None
            try:  # the fast path: a well-formed event
                key, amount, seq = fields["key"], int(fields["amount"]), int(fields["seq"])
                if "event" not in fields or not key:
                    raise KeyError("event")
            except (KeyError, ValueError):
                key, amount, seq, error = _parse(fields)
                bad[len(keys)] = (entry_id, str(error), json.dumps(fields, sort_keys=True))
            keys.append(key)
            amounts.append(amount)
            seqs.append(seq)
        cursor = entries[-1][0]
        n = len(keys)
        read += n
        nulls = pa.nulls(n, pa.string())
        if bad:
            ids, errors, raws = (
                pa.array([bad[i][j] if i in bad else None for i in range(n)], pa.string())
                for j in range(3))
        else:
            ids = errors = raws = nulls
        yield pa.RecordBatch.from_arrays([
            pa.array(np.full(n, partition, np.int32)), pa.array(np.full(n, token, np.int64)),
            nulls, nulls, ids, pa.array(keys, pa.string()),
            pa.array(amounts, pa.int64()), pa.array(seqs, pa.int64()), errors, raws,
        ], schema=SOURCE_SCHEMA)
    yield pa.RecordBatch.from_pylist(
        [{"partition": partition, "token": token, "from_id": from_id, "to_id": to_id,
          "seq": read}], schema=SOURCE_SCHEMA)


def aggregate(batches: Iterable[pa.RecordBatch]) -> list[PartitionResult]:
    """Per (partition, token, range): per-key count, total, first/last seq, gaps; dead letters."""
    table = pa.Table.from_batches(list(batches), schema=SOURCE_SCHEMA)
    if table.num_rows == 0:
        return []
    df = table.to_pandas()
    is_marker = df["from_id"].notna()
    events = df[~is_marker]
    by_range = {k: g for k, g in events.groupby(["partition", "token"], sort=False)}
    out: list[PartitionResult] = []
    for part, token, from_id, to_id, read in df.loc[
            is_marker, ["partition", "token", "from_id", "to_id", "seq"]].itertuples(index=False):
        res = PartitionResult(int(part), int(token), str(from_id), str(to_id), int(read))
        rows = by_range.get((part, token), events.iloc[:0])
        bad = rows[rows["error"].notna()]
        res.dead = [DeadLetter(str(i), str(r), str(w))
                    for i, r, w in zip(bad["id"], bad["error"], bad["raw"], strict=True)]
        good = rows[rows["error"].isna()]
        if len(good):
            by_key = good.groupby("key", sort=True)
            gaps = (by_key["seq"].diff().fillna(1) != 1).groupby(good["key"]).sum()
            agg = by_key.agg(count=("seq", "size"), total=("amount", "sum"),
                             first=("seq", "first"), last=("seq", "last"))
            res.keys = [KeyResult(str(k), int(c), int(t), int(f), int(la), int(gaps[k]))
                        for k, c, t, f, la in zip(agg.index, agg["count"], agg["total"],
                                                  agg["first"], agg["last"], strict=True)]
        out.append(res)
    return sorted(out, key=lambda r: r.partition)


def results_to_arrow(results: list[PartitionResult]) -> pa.RecordBatch:
    rows: list[dict[str, object]] = []
    for r in results:
        base = {"partition": r.partition, "token": r.token, "from_id": r.from_id, "to_id": r.to_id}
        rows.append({"kind": "part", **base, "count": r.events})
        rows.extend({"kind": "key", **base, "key": k.key, "count": k.count, "total": k.total,
                     "first_seq": k.first_seq, "last_seq": k.last_seq, "gaps": k.gaps}
                    for k in r.keys)
        rows.extend({"kind": "dead", **base, "key": d.id, "reason": d.reason, "raw": d.raw}
                    for d in r.dead)
    return pa.RecordBatch.from_pylist(rows, schema=RESULT_SCHEMA)


def results_from_rows(rows: Iterable[dict[str, object]]) -> list[PartitionResult]:
    """Inverse of :func:`results_to_arrow` (rows as dicts, e.g. ``Row.asDict()``)."""
    found: dict[tuple[int, int, str, str], PartitionResult] = {}
    for row in rows:
        ident = (int(row["partition"]), int(row["token"]),  # type: ignore[call-overload]
                 str(row["from_id"]), str(row["to_id"]))
        res = found.setdefault(ident, PartitionResult(*ident))
        kind = row["kind"]
        if kind == "part":
            res.events = int(row["count"])  # type: ignore[call-overload]
        elif kind == "key":
            res.keys.append(KeyResult(
                str(row["key"]), int(row["count"]), int(row["total"]),  # type: ignore[call-overload]
                int(row["first_seq"]), int(row["last_seq"]), int(row["gaps"])))  # type: ignore[call-overload]
        elif kind == "dead":
            res.dead.append(DeadLetter(str(row["key"]), str(row["reason"]), str(row["raw"])))
    return sorted(found.values(), key=lambda r: r.partition)
