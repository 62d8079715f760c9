"""A producer that follows the group's partition layout, fenced by the stream itself.

Streams are Redis Streams, one stream key per partition (``kgroup:{<stream>}:p:<n>``;
partition numbers are never reused, so a new generation's partitions are new keys).
Every write goes through :data:`APPEND_LUA`, which refuses the whole batch when any
partition it touches is **sealed** (listed in the stream's seals hash,
``kgroup:{<stream>}:seals``: partition -> ``<generation>/<marker id>``). A seal
(:data:`SEAL_LUA`) appends the marker entry (one field, ``kgroup-seal`` = the generation
that replaced the partition) and records it in the hash in one atomic step, so the marker
is the partition's last entry for ever: a producer that has not switched to the new
layout cannot write behind it unnoticed; its write is refused, it reads the layout again
and writes to the successor.

Rules (``kgroup.core.routing``):

- The layout is a :class:`kgroup.core.lineage.Lineage` from a source the caller gives
  (the group's ``status.layout``, decoded with :func:`kgroup.core.lineage_codec.decode`; a
  watch's latest value, read at every :meth:`LayoutProducer.send`, so keep it cheap).
  A source that goes back is ignored.
- Before its first write under a generation the producer seals every partition that
  generation replaced and that is not completed (idempotent: the first producer's seal
  counts, the others' change nothing).
- A refused write waits for the source to reach the sealing generation (at most
  ``layout_wait`` seconds, then :class:`LayoutBehind`), and routes again.

Side writes (e.g. a ledger of what was produced) can ride in the same script call and are
applied only if the events were: the stream and the ledger never disagree.

Every key a script touches shares the hash tag ``{<stream>}``, so a Redis Cluster keeps
them in one slot. The redis client is any ``redis.Redis``-like object (``register_script``);
this module does not import redis. It names the lineage's public pieces (``Lineage``,
``initial``, ``decode``, the changes) so a producer needs no import of ``kgroup.core``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kgroup.core.lineage import (
    Lineage,
    LineageError,
    Merge,
    Split,
    State,
    Uniform,
    initial,
)
from kgroup.core.lineage_codec import decode, encode
from kgroup.core.routing import (
    Refusal,
    after_refusal,
    layout_from_status,
    layout_to_status,
    newer,
    route,
    route_all,
    sealing_generation,
    to_seal,
)

__all__ = [
    "APPEND_LUA",
    "SEAL_FIELD",
    "SEAL_LUA",
    "FileLayout",
    "LayoutBehind",
    "LayoutProducer",
    "Lineage",
    "LineageError",
    "Merge",
    "SealRefused",
    "Sent",
    "SideWrite",
    "Split",
    "Uniform",
    "decode",
    "encode",
    "initial",
    "layout_from_status",
    "layout_to_status",
    "parse_seal",
    "route",
    "seal",
    "seals_key",
    "stream_key",
]

SEAL_FIELD = "kgroup-seal"
"""The one field of a seal marker entry (its value: the generation that replaced the
partition). Events may not carry it."""


def stream_key(stream: str, partition: int) -> str:
    """The Redis stream of one partition."""
    return f"kgroup:{{{stream}}}:p:{partition}"


def seals_key(stream: str) -> str:
    """Hash: partition -> ``<generation>/<marker id>`` of every sealed partition."""
    return f"kgroup:{{{stream}}}:seals"


def parse_seal(value: str) -> tuple[int, str]:
    """``"<generation>/<marker id>"`` -> (generation, marker id)."""
    gen, sep, marker = value.partition("/")
    if not sep or not gen.isdigit() or not marker:
        raise ValueError(f"not a seal record: {value!r:.60}")
    return int(gen), marker


# KEYS: seals hash, then each partition's stream, then the side writes' keys.
# ARGV: S (streams); per stream: partition, E (entries), per entry F (fields) and F pairs;
# then O (side writes); per write: op (hincrby | hset), index into KEYS, field, value.
APPEND_LUA = """
local s = tonumber(ARGV[1])
local refused = {}
local at = 2
local streams = {}
for i = 1, s do
  local part, e = ARGV[at], tonumber(ARGV[at + 1])
  local v = redis.call('HGET', KEYS[1], part)
  if v then refused[#refused + 1] = part; refused[#refused + 1] = v end
  streams[i] = {at + 2, e}
  at = at + 2
  for _ = 1, e do at = at + 1 + 2 * tonumber(ARGV[at]) end
end
if #refused > 0 then return {'sealed', unpack(refused)} end
local n = 0
for i = 1, s do
  local cur, e = streams[i][1], streams[i][2]
  for _ = 1, e do
    local f = tonumber(ARGV[cur])
    local entry = {}
    for j = 1, 2 * f do entry[j] = ARGV[cur + j] end
    redis.call('XADD', KEYS[1 + i], '*', unpack(entry))
    cur = cur + 1 + 2 * f
    n = n + 1
  end
end
local o = tonumber(ARGV[at])
at = at + 1
for _ = 1, o do
  local op, key, fld, val = ARGV[at], KEYS[tonumber(ARGV[at + 1])], ARGV[at + 2], ARGV[at + 3]
  if op == 'hincrby' then redis.call('HINCRBY', key, fld, val)
  elseif op == 'hset' then redis.call('HSET', key, fld, val)
  else return redis.error_reply('unknown side write ' .. op) end
  at = at + 4
end
return {'ok', tostring(n)}
"""

# KEYS: seals hash, then each partition's stream. ARGV: per stream its partition and the
# generation that replaced it. -> per partition its seal record (new or already there).
SEAL_LUA = """
local out = {}
for i = 1, #KEYS - 1 do
  local part, gen = ARGV[2 * i - 1], ARGV[2 * i]
  local v = redis.call('HGET', KEYS[1], part)
  if not v then
    local id = redis.call('XADD', KEYS[1 + i], '*', '""" + SEAL_FIELD + """', gen)
    v = gen .. '/' .. id
    redis.call('HSET', KEYS[1], part, v)
  end
  out[i] = v
end
return out
"""


class RedisLike(Protocol):
    def register_script(self, script: str) -> Any: ...


@dataclass(frozen=True)
class SideWrite:
    """A hash update applied in the same atomic step as the events, only if they are."""

    op: str  # "hincrby" | "hset"
    key: str
    field: str
    value: str | int

    def __post_init__(self) -> None:
        if self.op not in ("hincrby", "hset"):
            raise ValueError(f"side write {self.op!r}: only hincrby and hset")


class SealRefused(Exception):
    """The stream refused a write: these partitions are sealed (partition -> generation)."""

    def __init__(self, sealed: Mapping[int, int]) -> None:
        super().__init__(f"sealed partitions: {dict(sealed)}")
        self.sealed = dict(sealed)


class LayoutBehind(RuntimeError):
    """The layout source did not reach a generation that sealed a partition in time."""


@dataclass
class Sent:
    """One :meth:`LayoutProducer.send`: each event's partition, the generation routed by,
    and how many writes were refused on the way (0 unless a layout changed)."""

    partitions: list[int]
    generation: int
    refused: int = 0


def seal(script: Any, stream: str, seals: Mapping[int, int]) -> dict[int, str]:
    """Seal partitions (partition -> the generation that replaced it) with the registered
    :data:`SEAL_LUA`; -> partition -> its seal record. Idempotent."""
    parts = sorted(seals)
    if not parts:
        return {}
    raw = script(keys=[seals_key(stream), *(stream_key(stream, p) for p in parts)],
                 args=[x for p in parts for x in (p, seals[p])])
    return {p: str(v) for p, v in zip(parts, raw, strict=True)}


def _append_args(stream: str, events: Sequence[Mapping[str, str | int]],
                 partitions: Sequence[int], side: Sequence[SideWrite]
                 ) -> tuple[list[str], list[str | int]]:
    by_part: dict[int, list[Mapping[str, str | int]]] = {}
    for fields, p in zip(events, partitions, strict=True):
        by_part.setdefault(p, []).append(fields)
    keys = [seals_key(stream)]
    args: list[str | int] = [len(by_part)]
    for p, entries in by_part.items():
        keys.append(stream_key(stream, p))
        args += [p, len(entries)]
        for fields in entries:
            args.append(len(fields))
            for k, v in fields.items():
                args += [k, v]
    args.append(len(side))
    index: dict[str, int] = {}
    for w in side:
        if w.key not in index:
            keys.append(w.key)
            index[w.key] = len(keys)
        args += [w.op, index[w.key], w.field, w.value]
    return keys, args


@dataclass
class LayoutProducer:
    """Writes keyed events to the partitions of the newest generation of ``layout()``.
    One thread at a time (give each thread its own producer)."""

    client: RedisLike
    stream: str
    layout: Callable[[], Lineage]
    layout_wait: float = 30.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    refusals: int = field(default=0, init=False)
    """Writes a seal refused (each then routed again by a newer layout)."""
    seals_written: dict[int, str] = field(default_factory=dict, init=False)
    """partition -> seal record of every seal this producer ensured."""
    _lineage: Lineage | None = field(default=None, init=False)
    _sealed_for: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._append = self.client.register_script(APPEND_LUA)
        self._seal = self.client.register_script(SEAL_LUA)

    @property
    def lineage(self) -> Lineage:
        """The layout routed by now (read from the source if never read)."""
        return self._current()

    def _current(self) -> Lineage:
        lineage = self._lineage = newer(self._lineage, self.layout())
        if lineage.latest.number != self._sealed_for:
            # seal what this generation replaced before its first write
            wanted = {p: sealing_generation(lineage, p) for p in to_seal(lineage)}
            self.seals_written.update(seal(self._seal, self.stream, wanted))
            self._sealed_for = lineage.latest.number
        return lineage

    def send(self, keys: Sequence[str], events: Sequence[Mapping[str, str | int]],
             side: Callable[[Sequence[int]], Sequence[SideWrite]] | None = None) -> Sent:
        """Append ``events[i]`` to the partition of ``keys[i]``, all or nothing, with the
        side writes ``side(partitions)`` returns for the routing used (called again if a
        seal made the producer route again)."""
        if len(keys) != len(events):
            raise ValueError(f"{len(keys)} keys for {len(events)} events")
        if any(SEAL_FIELD in e for e in events):
            raise ValueError(f"an event may not carry the field {SEAL_FIELD!r}: it marks a seal")
        if not all(events):
            raise ValueError("an event needs at least one field (a stream entry has one)")
        refused = 0
        while True:
            lineage = self._current()
            parts = route_all(lineage, keys)
            try:
                self._write(events, parts, side(parts) if side else ())
                return Sent(parts, lineage.latest.number, refused)
            except SealRefused as exc:
                refused += 1
                self.refusals += 1
                self._wait_past(exc.sealed)

    def _write(self, events: Sequence[Mapping[str, str | int]], parts: Sequence[int],
               side: Sequence[SideWrite]) -> None:
        if not events:
            return
        keys, args = _append_args(self.stream, events, parts, side)
        raw = self._append(keys=keys, args=args)
        if raw[0] != "ok":
            sealed = {int(p): parse_seal(str(v))[0] for p, v in zip(raw[1::2], raw[2::2],
                                                                   strict=True)}
            raise SealRefused(sealed)

    def _wait_past(self, sealed: Mapping[int, int]) -> None:
        """Read the layout again until every refused partition is replaced in it."""
        deadline = self.clock() + self.layout_wait
        pause = 0.01
        while True:
            lineage = self._current()
            if all(after_refusal(lineage, p, g) is Refusal.REROUTE for p, g in sealed.items()):
                return
            if self.clock() >= deadline:
                raise LayoutBehind(f"partitions {sorted(sealed)} are sealed by generation "
                                   f"{max(sealed.values())}, but the layout is still at "
                                   f"generation {lineage.latest.number} after "
                                   f"{self.layout_wait:g} s")
            self.sleep(pause)
            pause = min(pause * 2, 0.5)


class FileLayout:
    """A layout source: a JSON file holding the group's ``status.layout`` (e.g. written by
    ``kubectl get cg NAME -o jsonpath='{.status.layout}'``), read again when it changes.
    No file, or an empty one: one modulo generation of ``partitions`` (a group without a
    layout). A file that does not decode raises :class:`LineageError` with the reason:
    the producer stops rather than guess where keys go."""

    def __init__(self, path: str, partitions: int) -> None:
        self.path, self.partitions = path, partitions
        self._seen: tuple[int, int] | None = None
        self._lineage = layout_from_status(None, partitions)

    def __call__(self) -> Lineage:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._lineage
        if (st.st_mtime_ns, st.st_size) != self._seen:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
            try:
                doc = json.loads(text) if text.strip() else None
            except json.JSONDecodeError as exc:
                raise LineageError(f"{self.path}: not JSON: {exc}") from None
            self._lineage = layout_from_status(doc, self.partitions)
            self._seen = (st.st_mtime_ns, st.st_size)
        return self._lineage


class Sealer:
    """For a partition's owner: seals the partitions it holds that the layout calls sealed,
    so a reshape completes even when no producer has written since (a producer seals only
    when it writes), and a producer still on the old layout is fenced from then on.
    Idempotent, and each partition is sealed at most once per sealer."""

    def __init__(self, client: RedisLike, stream: str,
                 layout: Callable[[], Lineage] | None = None) -> None:
        self.stream, self.layout = stream, layout
        self._seal = client.register_script(SEAL_LUA)
        self.sealed: dict[int, str] = {}

    def step(self, partitions: Iterable[int]) -> dict[int, str]:
        """Seal those of ``partitions`` the layout calls sealed; -> the ones sealed now."""
        if self.layout is None:
            return {}
        lineage = self.layout()
        return self.seal({p: sealing_generation(lineage, p) for p in partitions
                          if p in lineage.partitions and lineage.state(p) is State.SEALED})

    def seal(self, sealed_by: Mapping[int, int]) -> dict[int, str]:
        """Seal each partition (-> the generation that replaced it: the sidecar's view
        says so, ``PartitionView.sealed_by``) not sealed by this sealer yet; -> the ones
        sealed now."""
        todo = {p: g for p, g in sealed_by.items() if p not in self.sealed}
        done = seal(self._seal, self.stream, todo)
        self.sealed.update(done)
        return done
