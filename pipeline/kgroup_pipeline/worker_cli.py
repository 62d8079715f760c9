"""Command-line plumbing shared by the PySpark worker and the light worker.

Both take the same source arguments (Redis, stream, where ownership comes from), fall back
to the environment the local runner and the chart set (``KGROUP_REDIS_URL``,
``KGROUP_STREAM``, ``KGROUP_SIDECAR_URL``), and stop on SIGTERM/SIGINT by setting an
event, so the running batch finishes and the partitions are handed over before exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from types import FrameType


def add_source_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--redis", default=os.environ.get("KGROUP_REDIS_URL"))
    ap.add_argument("--stream", default=os.environ.get("KGROUP_STREAM"))
    ap.add_argument("--sidecar", default=os.environ.get("KGROUP_SIDECAR_URL"))
    ap.add_argument("--static", default=None, help="partitions owned without a sidecar: 0-15")
    ap.add_argument("--token", type=int, default=1, help="token of --static partitions")


def ownership_spec(ap: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """Validate the source arguments; the ownership spec for ``ownership_from_spec``."""
    if not args.redis or not args.stream:
        ap.error("--redis and --stream are required (or KGROUP_REDIS_URL, KGROUP_STREAM)")
    if args.static is None and not args.sidecar:
        ap.error("--sidecar (or KGROUP_SIDECAR_URL) or --static is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return f"static:{args.static}@{args.token}" if args.static else f"sidecar:{args.sidecar}"


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (the worker's loop finishes its batch, then stops)."""
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return stop
