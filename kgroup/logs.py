"""Log set-up shared by the sidecar and the operator: a level that holds, text or JSON lines.

``KGROUP_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR, CRITICAL) is the root logger's level,
so ``WARNING`` hides every INFO line, ours and the libraries'. ``KGROUP_LOG_FORMAT=json``
writes one JSON object per line through python-json-logger, the library kopf's own JSON
formatter is built on, so the operator's lines (kopf's formatter) and the sidecar's (this
one) carry the same keys: ``message``, ``name``, ``severity`` (debug/info/warn/error/fatal)
and ``timestamp`` (ISO 8601, UTC), plus ``exc_info`` with a traceback. Only the sidecar and
the operator import this module: python-json-logger comes with their extras.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def severity(levelno: int) -> str:
    """kopf's severity words, so both components' JSON lines read alike."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    if levelno <= logging.ERROR:
        return "error"
    return "fatal"


class KgroupJsonFormatter(JsonFormatter):
    """One JSON object per record: message, name, severity, timestamp (+ extras)."""

    def __init__(self) -> None:
        super().__init__("%(message)s %(name)s", timestamp=True)

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord,
                   message_dict: dict[str, Any]) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data.setdefault("severity", severity(record.levelno))


class _KgroupHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler :func:`configure` installed, so a second call replaces it."""


def configure(level: str = "INFO", fmt: str = "text") -> logging.Handler:
    """Install one stderr handler on the root logger with ``fmt`` and set ``level``."""
    level = level.upper()
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    handler = _KgroupHandler(sys.stderr)
    handler.setFormatter(KgroupJsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _KgroupHandler)]
    root.addHandler(handler)
    root.setLevel(level)
    return handler
