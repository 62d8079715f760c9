"""Redis key layout of one kgroup stream, and the key -> partition hash.

Rule: every name a producer, worker or verifier uses lives here, so they cannot drift.
All keys of a stream share the hash tag ``{stream}``, so a Redis Cluster keeps them in
one slot and the fenced Lua scripts may touch any of them in one atomic step.

Layout (one stream key per partition, as in Runnel):

- ``kgroup:{s}:p:{n}``            the events of partition n (a Redis stream); a sealed
                                  partition ends with its seal marker (``kgroup.producer``)
- ``kgroup:{s}:seals``            partition -> ``<generation>/<marker id>`` of each sealed one
- ``kgroup:{s}:dead``             dead letters (malformed events, with the reason)
- ``kgroup:{s}:produced:*``       the producer's ledger (what it wrote, per key and per
                                  partition)
- ``kgroup:{s}:sink:p:{n}``       the sink's per-partition record: committed offset, token, ...
- ``kgroup:{s}:sink:{count|total|last}:{n}``  per-key results of partition n
- ``kgroup:{s}:sink:key:{last|ooo}``  per key across partitions and generations: the last
                                  seq committed, and how often a key's order broke
- ``kgroup:{s}:zombie_refused``   batches refused because their token was stale
- ``kgroup:{s}:replay_refused``   batches refused because their ``from`` was not the offset
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from kgroup.producer import seals_key, stream_key

ZERO_ID = "0-0"


def partition_for(key: str, partitions: int) -> int:
    """The partition of an event key: a hash that is stable across processes and runs."""
    return zlib.crc32(key.encode()) % partitions


def parse_id(stream_id: str) -> tuple[int, int]:
    """A Redis stream id ``ms-seq`` as a comparable pair."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True)
class StreamKeys:
    """The Redis keys of one logical stream."""

    stream: str

    @property
    def prefix(self) -> str:
        return f"kgroup:{{{self.stream}}}"

    def partition(self, n: int) -> str:
        return stream_key(self.stream, n)

    @property
    def seals(self) -> str:
        """Hash: partition -> ``<generation>/<marker id>`` (``kgroup.producer``)."""
        return seals_key(self.stream)

    @property
    def dead(self) -> str:
        return f"{self.prefix}:dead"

    # -- the producer's ledger
    @property
    def meta(self) -> str:
        """Hash: ``partitions`` (the partition count the producer used)."""
        return f"{self.prefix}:meta"

    @property
    def produced_seq(self) -> str:
        """Hash: key -> last seq produced (seqs start at 1 and have no gaps)."""
        return f"{self.prefix}:produced:seq"

    @property
    def produced_total(self) -> str:
        """Hash: key -> sum of amounts produced."""
        return f"{self.prefix}:produced:total"

    @property
    def produced_count(self) -> str:
        """Hash: partition -> well-formed events produced."""
        return f"{self.prefix}:produced:count"

    def produced_keys(self, n: int) -> str:
        """Hash: key -> well-formed events of that key produced to partition n."""
        return f"{self.prefix}:produced:keys:{n}"

    @property
    def produced_bad(self) -> str:
        """Hash: partition -> malformed events produced."""
        return f"{self.prefix}:produced:bad"

    # -- the sink
    def sink_partition(self, n: int) -> str:
        return f"{self.prefix}:sink:p:{n}"

    def sink_count(self, n: int) -> str:
        return f"{self.prefix}:sink:count:{n}"

    def sink_total(self, n: int) -> str:
        return f"{self.prefix}:sink:total:{n}"

    def sink_last(self, n: int) -> str:
        return f"{self.prefix}:sink:last:{n}"

    @property
    def key_last(self) -> str:
        """Hash: key -> the last seq committed, whichever partition it was in."""
        return f"{self.prefix}:sink:key:last"

    @property
    def key_ooo(self) -> str:
        """Hash: key -> committed events of the key that did not follow its last seq."""
        return f"{self.prefix}:sink:key:ooo"

    @property
    def zombie_refused(self) -> str:
        return f"{self.prefix}:zombie_refused"

    @property
    def replay_refused(self) -> str:
        return f"{self.prefix}:replay_refused"
