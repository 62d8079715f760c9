"""Reading a planned range of one partition, and turning it into per-key results.

Rule: the Spark job and the light worker share these functions, so they compute the same
output for the same range. A range is ``(from, to]`` in stream ids: exclusive of ``from``
(the committed offset), inclusive of ``to`` (the planned end), and never beyond ``to``
even when more events have arrived since the batch was planned.

A malformed event (a field missing, a non-numeric amount or seq) becomes a dead letter
with its reason; it counts as read (the offset moves past it) and never stops the job.
A seal marker (an entry whose one field is ``kgroup-seal``: the partition's end after a
reshape, ``kgroup.producer``) is no event: it counts as read and yields no row.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from redis.client import NEVER_DECODE

from kgroup.producer import SEAL_FIELD
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


_INT = "^-?[0-9]+$"  # what both int() and Arrow's cast read the same way
_NAMES = (b"key", b"amount", b"event", b"seq")
_SEAL = SEAL_FIELD.encode()


def _raw_client(client: redis.Redis) -> redis.Redis:
    """A client on the same pool whose XRANGE answers hiredis' nested lists of bytes as they
    are (no per-entry dict, no decoding): the columns are cut out of them in C."""
    raw = redis.Redis(connection_pool=client.connection_pool)
    raw.set_response_callback("XRANGE", lambda r, **kw: r)
    return raw


def _columns(fields: list[list[bytes]]) -> tuple[pa.Array, pa.Array, pa.Array] | None:
    """(key, amount, seq) of a chunk whose entries all have the four fields at the same
    places and well-formed values, found without a Python step per entry; else None."""
    n = len(fields)
    first = fields[0]
    if len(first) != 8 or set(first[0::2]) != set(_NAMES) \
            or list(map(len, fields)).count(8) != n:
        return None
    flat = list(itertools.chain.from_iterable(fields))
    at = {name: first.index(name) for name in _NAMES}
    if any(flat[i::8].count(name) != n for name, i in at.items()):
        return None
    try:
        key = pa.array(flat[at[b"key"] + 1::8], pa.binary()).cast(pa.string())
        nums = [pa.array(flat[at[f] + 1::8], pa.binary()).cast(pa.string())
                for f in (b"amount", b"seq")]
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    if pc.any(pc.equal(pc.binary_length(key), 0)).as_py() or not all(
            pc.all(pc.match_substring_regex(a, _INT)).as_py() for a in nums):
        return None
    try:
        amount, seq = (a.cast(pa.int64()) for a in nums)
    except pa.ArrowInvalid:  # beyond int64
        return None
    return key, amount, seq


def _slow_chunk(entries: list[Any]) -> tuple[list[Any], list[Any], list[Any],
                                              dict[int, tuple[str, str, str]]]:
    keys: list[str | None] = []
    amounts: list[int | None] = []
    seqs: list[int | None] = []
    bad: dict[int, tuple[str, str, str]] = {}
    for entry_id, raw_fields in entries:
        if len(raw_fields) == 2 and raw_fields[0] == _SEAL:
            continue  # a seal marker: read, but no event
        fields = {k.decode(errors="replace"): v.decode(errors="replace")
                  for k, v in zip(raw_fields[0::2], raw_fields[1::2], strict=True)}
        key, amount, seq, error = _parse(fields)
        if error is not None:
            bad[len(keys)] = (entry_id.decode(), error, json.dumps(fields, sort_keys=True))
        keys.append(key)
        amounts.append(amount)
        seqs.append(seq)
    return keys, amounts, seqs, bad


def read_range(
    client: redis.Redis, *, stream: str, partition: int, token: int, from_id: str, to_id: str,
    limit: int | None = None, chunk: int = 10_000,
) -> Iterator[pa.RecordBatch]:
    """The events of ``(from_id, to_id]`` of one partition, at most the first `limit` of
    them, as RecordBatches (SOURCE_SCHEMA), then the marker row closing the range: its
    ``to_id`` is where the read stopped (``to_id`` itself unless `limit` cut it short).

    The same range always reads the same entries (ids only grow, so nothing can enter
    ``(from, to]`` later): a retried task or a second action sees the same rows.
    """
    name = StreamKeys(stream).partition(partition)
    raw = _raw_client(client)
    cursor, end = from_id, to_id
    left = limit if limit is not None else -1
    read = 0
    while cursor != to_id and left != 0:
        count = chunk if left < 0 else min(chunk, left)
        entries: Any = raw.execute_command(  # type: ignore[no-untyped-call]
            "XRANGE", name, "(" + cursor, to_id, "COUNT", count, **{NEVER_DECODE: True})
        if not entries:
            break
        n = len(entries)
        cursor = entries[-1][0].decode()
        read += n
        left = left - n if left > 0 else left
        if left == 0:
            end = cursor
        cols = _columns([e[1] for e in entries])
        if cols is not None:
            key, amount, seq = cols
            ids = errors = raws = nulls = pa.nulls(n, pa.string())
        else:
            keys, amounts, seqs, bad = _slow_chunk(entries)
            n = len(keys)  # without seal markers
            if n == 0:
                continue
            nulls = pa.nulls(n, pa.string())
            key, amount, seq = (pa.array(keys, pa.string()), pa.array(amounts, pa.int64()),
                                pa.array(seqs, pa.int64()))
            if bad:
                ids, errors, raws = (
                    pa.array([bad[i][j] if i in bad else None for i in range(n)], pa.string())
                    for j in range(3))
            else:
                ids = errors = raws = nulls
        yield pa.RecordBatch.from_arrays([
            pa.array(np.full(n, partition, np.int32)), pa.array(np.full(n, token, np.int64)),
            nulls, nulls, ids, key, amount, seq, errors, raws], schema=SOURCE_SCHEMA)
    yield pa.RecordBatch.from_pylist(
        [{"partition": partition, "token": token, "from_id": from_id, "to_id": end,
          "seq": read}], schema=SOURCE_SCHEMA)


def _key_groups(events: pa.Table) -> dict[tuple[int, int], list[KeyResult]]:
    """(partition, token) -> per-key results of the well-formed events, in C: one stable
    sort by (partition, token, key), then reductions over the runs."""
    if events.num_rows == 0:
        return {}
    keys = pc.dictionary_encode(events["key"]).combine_chunks()
    names = keys.dictionary
    rank = np.empty(len(names), np.int64)  # dictionary code -> rank of the key's name
    rank[pc.sort_indices(names).to_numpy()] = np.arange(len(names))
    code = rank[keys.indices.to_numpy(zero_copy_only=False)]
    ranges = pc.dictionary_encode(pc.binary_join_element_wise(
        pc.cast(events["partition"], pa.string()), pc.cast(events["token"], pa.string()),
        "/")).combine_chunks()
    comp = ranges.indices.to_numpy(zero_copy_only=False).astype(np.int64) * len(names) + code
    order = np.argsort(comp, kind="stable")  # stable: stream order within a key
    c = comp[order]
    seq = events["seq"].to_numpy()[order]
    amount = events["amount"].to_numpy()[order]
    cut = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    last = np.r_[cut[1:], len(c)] - 1
    same = np.r_[False, c[1:] == c[:-1]]
    broken = same & np.r_[False, seq[1:] != seq[:-1] + 1]
    gaps = np.add.reduceat(broken.astype(np.int64), cut)
    total = np.add.reduceat(amount, cut)
    sorted_names = pc.take(names, pc.sort_indices(names)).to_pylist()
    range_names = ranges.dictionary.to_pylist()
    out: dict[tuple[int, int], list[KeyResult]] = {}
    for i, (s, e) in enumerate(zip(cut.tolist(), last.tolist(), strict=True)):
        r, k = divmod(int(c[s]), len(names))
        part, tok = range_names[r].split("/")
        out.setdefault((int(part), int(tok)), []).append(KeyResult(
            sorted_names[k], e - s + 1, int(total[i]), int(seq[s]), int(seq[e]), int(gaps[i])))
    return out


def aggregate(batches: Iterable[pa.RecordBatch]) -> list[PartitionResult]:
    """Per (partition, token, range): per-key count, total, first/last seq, gaps; dead letters."""
    table = pa.Table.from_batches(list(batches), schema=SOURCE_SCHEMA)
    if table.num_rows == 0:
        return []
    is_marker = pc.is_valid(table["from_id"])
    markers = table.filter(is_marker)
    events = table.filter(pc.invert(is_marker))
    bad_rows = pc.is_valid(events["error"])
    by_range = _key_groups(events.filter(pc.invert(bad_rows)))
    dead: dict[tuple[int, int], list[DeadLetter]] = {}
    for part, token, i, r, w in zip(*(events.filter(bad_rows)[c].to_pylist() for c in (
            "partition", "token", "id", "error", "raw")), strict=True):
        dead.setdefault((part, token), []).append(DeadLetter(str(i), str(r), str(w)))
    out: list[PartitionResult] = []
    for part, token, from_id, to_id, read in zip(*(markers[c].to_pylist() for c in (
            "partition", "token", "from_id", "to_id", "seq")), strict=True):
        res = PartitionResult(int(part), int(token), str(from_id), str(to_id), int(read))
        res.keys = by_range.get((part, token), [])
        res.dead = dead.get((part, token), [])
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
