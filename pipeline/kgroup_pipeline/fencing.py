"""The fenced sink: output and offsets of a partition committed in one atomic Lua step.

Rule: the sink's record of a partition (``offset``, ``token``) is the truth about how far
that partition has been processed, and every write to it is fenced by the token:

- ``PLAN`` (at batch planning) claims the partition for a token — it raises the stored
  token to ours, so any older owner's later write is refused — and returns the range to
  read: from the committed offset (or, for a partition the sink has never seen, the
  position handed over with the lock) up to at most ``max_rows`` entries. It refuses to
  plan a partition whose stored token is higher (we are the zombie) or which we sealed.
- ``COMMIT`` applies one range's output (per-key count, total, last seq, out-of-order
  counter, dead letters) and moves the offset to ``to``, all or nothing. It refuses, and
  counts, a batch whose token is lower than the stored one (``zombie_refused``) or whose
  ``from`` is not the committed offset (``replay_refused``: a gap or a replay).
- ``SEAL`` (at handoff) forbids any further plan of the partition under this token and
  returns the committed offset and the last planned end, so the handoff knows when the
  last batch that read the partition has been committed.

Two different seals: the handoff's ``SEAL`` above closes the sink to one *token*; a
partition's *seal marker* (``kgroup.producer``, after a reshape) closes its *stream* for
ever. ``PLAN`` never plans past a partition's seal marker, and once the committed offset
is the marker it answers ``completed`` (and records ``completed`` = the marker's id in the
sink's record): everything written before the seal is processed, and the worker reports
completion (``kgroup_pipeline.completion``). An empty sealed partition holds only its
marker: its first range reads it and its next plan completes.

``COMMIT`` checks each key's order across partitions and generations: a key's first seq
in a range must follow the last seq committed for that key in *any* partition
(``sink:key:last``; before a reshape that is the key's one partition). A break counts in
the partition's ``ooo`` and in ``sink:key:ooo`` (key -> breaks).

Each partition is committed by its own script call (partitions' outputs are disjoint), so
a batch that carries one stale partition still commits the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from kgroup_pipeline.keys import ZERO_ID, StreamKeys
from kgroup_pipeline.ownership import OwnedPartition
from kgroup_pipeline.range_reader import PartitionResult

PLAN_LUA = """
local max = tonumber(ARGV[1])
local function after(a, b)  -- stream id a > b
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am > bm or (am == bm and as > bs)
end
local out = {}
local seals = KEYS[#KEYS]
for i = 1, (#KEYS - 1) / 2 do
  local sink, stream = KEYS[2*i-1], KEYS[2*i]
  local token = tonumber(ARGV[3*i-1])
  local handed = ARGV[3*i]
  local seal = redis.call('HGET', seals, ARGV[3*i+1])
  local ends = ''
  if seal then ends = string.match(seal, '^%d+/(.+)$') or '' end
  local stored = tonumber(redis.call('HGET', sink, 'token') or '0')
  local sealed = tonumber(redis.call('HGET', sink, 'sealed') or '0')
  if stored > token then
    out[#out+1] = {'fenced', '', '', 0, ends}
  elseif sealed >= token then
    out[#out+1] = {'sealed', '', '', 0, ends}
  else
    if stored < token then redis.call('HSET', sink, 'token', token) end
    local from = redis.call('HGET', sink, 'offset')
    if not from then
      if handed ~= '' then from = handed else from = '0-0' end
      redis.call('HSET', sink, 'offset', from)
    end
    local to, n = from, 0
    if ends ~= '' and from == ends then
      redis.call('HSET', sink, 'completed', ends)
    elseif redis.call('EXISTS', stream) == 1 then
      local info = redis.call('XINFO', 'STREAM', stream)
      local last, added = '0-0', 0
      for j = 1, #info, 2 do
        if info[j] == 'last-generated-id' then last = info[j+1] end
        if info[j] == 'entries-added' then added = tonumber(info[j+1]) end
      end
      if ends ~= '' and after(last, ends) then last = ends end  -- the seal ends it
      if after(last, from) then
        to = last
        local done = tonumber(redis.call('HGET', sink, 'events') or '0')
        n = math.max(1, math.min(max, added - done))
        redis.call('HSET', sink, 'planned_from', from, 'planned_token', token)
      end
    end
    if ends ~= '' and from == ends then
      out[#out+1] = {'completed', from, to, 0, ends}
    else
      out[#out+1] = {'ok', from, to, n, ends}
    end
  end
end
return out
"""

COMMIT_LUA = """
local part, token, from, to = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local stored = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if stored > token then
  redis.call('INCR', KEYS[6])
  redis.call('HINCRBY', KEYS[1], 'zombie_refused', 1)
  return {'stale-token', tostring(stored)}
end
local offset = redis.call('HGET', KEYS[1], 'offset') or '0-0'
if offset ~= from then
  redis.call('INCR', KEYS[7])
  redis.call('HINCRBY', KEYS[1], 'replay_refused', 1)
  return {'offset-mismatch', offset}
end
local nkeys = tonumber(ARGV[6])
local ooo = 0
for k = 0, nkeys - 1 do
  local b = 7 + k * 6
  local key = ARGV[b]
  -- the key's last seq in any partition (a sink older than that hash: this partition's)
  local last = tonumber(redis.call('HGET', KEYS[8], key) or
                        redis.call('HGET', KEYS[4], key) or '0')
  local broken = tonumber(ARGV[b+5])
  if tonumber(ARGV[b+3]) ~= last + 1 then broken = broken + 1 end
  if broken > 0 then redis.call('HINCRBY', KEYS[9], key, broken) end
  ooo = ooo + broken
  redis.call('HINCRBY', KEYS[2], key, ARGV[b+1])
  redis.call('HINCRBY', KEYS[3], key, ARGV[b+2])
  redis.call('HSET', KEYS[4], key, ARGV[b+4])
  redis.call('HSET', KEYS[8], key, ARGV[b+4])
end
local d = 7 + nkeys * 6
local ndead = tonumber(ARGV[d])
for j = 0, ndead - 1 do
  local b = d + 1 + j * 3
  redis.call('XADD', KEYS[5], '*', 'partition', part, 'id', ARGV[b], 'reason', ARGV[b+1],
             'raw', ARGV[b+2])
end
redis.call('HSET', KEYS[1], 'offset', to, 'token', token)
redis.call('HINCRBY', KEYS[1], 'events', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'dead', ndead)
redis.call('HINCRBY', KEYS[1], 'ooo', ooo)
redis.call('HINCRBY', KEYS[1], 'batches', 1)
return {'committed', to}
"""

SEAL_LUA = """
local token = tonumber(ARGV[1])
local stored = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if stored > token then return {'fenced', '', '', '0'} end
local sealed = tonumber(redis.call('HGET', KEYS[1], 'sealed') or '0')
if token > sealed then redis.call('HSET', KEYS[1], 'sealed', token) end
return {'sealed', redis.call('HGET', KEYS[1], 'offset') or '',
        redis.call('HGET', KEYS[1], 'planned_from') or '',
        redis.call('HGET', KEYS[1], 'planned_token') or '0'}
"""


@dataclass(frozen=True)
class Plan:
    partition: int
    token: int
    status: str  # ok | fenced | sealed (the handoff's) | completed (read to its seal marker)
    from_id: str
    to_id: str  # the stream's last id at planning (at most the seal marker): the range is
    #             (from, to], first `limit`
    rows: int  # an upper bound of the entries to read (0: nothing new), at most `limit`
    limit: int
    seal: str = ""  # the partition's seal marker id, "" while it is open


@dataclass(frozen=True)
class Outcome:
    partition: int
    status: str  # committed | stale-token | offset-mismatch
    detail: str


@dataclass(frozen=True)
class Seal:
    status: str  # sealed | fenced
    offset: str | None
    drained: bool  # no range planned under this token is still uncommitted


class FencedStore:
    """The three fenced scripts of one stream, over a ``decode_responses=True`` client."""

    def __init__(self, client: redis.Redis, stream: str) -> None:
        self.client = client
        self.stream = stream
        self.keys = StreamKeys(stream)
        self._plan = client.register_script(PLAN_LUA)
        self._commit = client.register_script(COMMIT_LUA)
        self._seal = client.register_script(SEAL_LUA)

    def plan(self, owned: Sequence[OwnedPartition], *, max_rows: int) -> list[Plan]:
        if not owned:
            return []
        keys: list[str] = []
        args: list[str | int] = [max(1, max_rows)]
        for p in owned:
            keys += [self.keys.sink_partition(p.partition), self.keys.partition(p.partition)]
            args += [p.token, p.position or "", p.partition]
        keys.append(self.keys.seals)
        raw = self._plan(keys=keys, args=args)
        return [Plan(p.partition, p.token, str(s), str(f), str(t), int(n), max(1, max_rows),
                     str(e)) for p, (s, f, t, n, e) in zip(owned, raw, strict=True)]

    def _commit_call(self, r: PartitionResult, client: redis.client.Pipeline | None) -> object:
        n = r.partition
        keys = [self.keys.sink_partition(n), self.keys.sink_count(n), self.keys.sink_total(n),
                self.keys.sink_last(n), self.keys.dead, self.keys.zombie_refused,
                self.keys.replay_refused, self.keys.key_last, self.keys.key_ooo]
        args: list[str | int] = [n, r.token, r.from_id, r.to_id, r.events, len(r.keys)]
        for k in r.keys:
            args += [k.key, k.count, k.total, k.first_seq, k.last_seq, k.gaps]
        args.append(len(r.dead))
        for d in r.dead:
            args += [d.id, d.reason, d.raw]
        return self._commit(keys=keys, args=args, client=client)

    def commit(self, results: Sequence[PartitionResult]) -> list[Outcome]:
        """Commit each range with its own atomic script call, in one round trip."""
        if not results:
            return []
        pipe = self.client.pipeline(transaction=False)
        for r in results:
            self._commit_call(r, pipe)
        raw = pipe.execute()
        return [Outcome(r.partition, str(s), str(d))
                for r, (s, d) in zip(results, raw, strict=True)]

    def seal(self, partition: int, token: int) -> Seal:
        status, offset, planned_from, planned_token = self._seal(
            keys=[self.keys.sink_partition(partition)], args=[token])
        # a planned range always ends past its start, so its commit moves the offset
        drained = int(planned_token) != token or planned_from == "" or planned_from != offset
        return Seal(str(status), offset or None, drained)

    def committed(self, partition: int) -> dict[str, str]:
        raw = self.client.hgetall(self.keys.sink_partition(partition))
        return {str(k): str(v) for k, v in raw.items()}

    def offset(self, partition: int) -> str:
        return str(self.client.hget(self.keys.sink_partition(partition), "offset") or ZERO_ID)

    def refused(self) -> tuple[int, int]:
        """(zombie_refused, replay_refused) for the whole stream."""
        z, r = self.client.mget([self.keys.zombie_refused, self.keys.replay_refused])
        return int(z or 0), int(r or 0)
