"""Append-only audit trail of ownership changes (``KGROUP_AUDIT_FILE``, JSON lines).

One line per acquisition, release, fence or loss, with both clocks: ``wall`` (epoch
seconds) for people and ``mono`` (CLOCK_MONOTONIC, shared by every process on one Linux
host) for checkers that prove no two sessions were active owners of one partition at
once. A fence line carries ``until``: the monotonic time ownership really ended (the
fencing deadline), which may be earlier than the line itself (e.g. after SIGSTOP).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


class AuditLog:
    def __init__(self, path: str | None, member: str) -> None:
        self._path = path
        self._member = member

    def write(
        self,
        event: str,
        *,
        session: str | None,
        partition: int | None = None,
        token: int | None = None,
        mono: float | None = None,
        **extra: Any,
    ) -> None:
        if self._path is None:
            return
        record: dict[str, Any] = {
            "wall": time.time(),
            "mono": time.monotonic() if mono is None else mono,
            "member": self._member,
            "session": session,
            "partition": partition,
            "token": token,
            "event": event,
            "pid": os.getpid(),
        }
        record.update(extra)
        # One write() of a whole line in append mode: lines from one process never mix.
        with open(self._path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")
            out.flush()
