"""Log levels and formats: the formatter (pure), and a real ``kgroup-sidecar`` process whose
``KGROUP_LOG_LEVEL=WARNING`` hides its INFO lines (its API server is a closed port: it
starts, logs, and keeps warning that it cannot start a session)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kgroup.logs import KgroupJsonFormatter, configure


def test_json_lines_carry_message_name_severity_and_time() -> None:
    record = logging.LogRecord("kgroup_sidecar.runtime", logging.WARNING, __file__, 1,
                               "partition %d lost", (3,), None)
    line = json.loads(KgroupJsonFormatter().format(record))
    assert line["message"] == "partition 3 lost"
    assert line["name"] == "kgroup_sidecar.runtime"
    assert line["severity"] == "warn"
    assert line["timestamp"].startswith("20")


def test_configure_replaces_its_handler_and_refuses_unknown_levels() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        first = configure("WARNING", "json")
        second = configure("info", "text")
        assert first not in root.handlers and second in root.handlers
        assert root.level == logging.INFO
        with pytest.raises(ValueError):
            configure("LOUD", "text")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_api_kubeconfig(path: Path) -> Path:
    """A kubeconfig whose API server is a closed port on 127.0.0.1."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{_closed_port()}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


def _sidecar_log(tmp_path: Path, level: str, fmt: str) -> str:
    kubeconfig = dead_api_kubeconfig(tmp_path / f"kubeconfig-{level}")
    env = {**os.environ, "KGROUP_GROUP": "g", "KGROUP_NAMESPACE": "ns", "KGROUP_POD_NAME": "p",
           "KGROUP_LISTEN": f"127.0.0.1:{_closed_port()}", "KUBECONFIG": str(kubeconfig),
           "KGROUP_LOG_LEVEL": level, "KGROUP_LOG_FORMAT": fmt, "NO_PROXY": "127.0.0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "kgroup_sidecar.main"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    try:
        # it starts, listens, and warns that it cannot reach the API server: read up to
        # the first warning (every line before it is what its level let through)
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "WARNING" in line or '"warn"' in line:
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    return "".join(lines)


def test_a_real_sidecar_at_warning_hides_info_and_at_info_shows_it(tmp_path: Path) -> None:
    loud = _sidecar_log(tmp_path, "INFO", "text")
    assert " INFO kgroup_sidecar: listening on" in loud
    assert " WARNING " in loud
    quiet = _sidecar_log(tmp_path, "WARNING", "json")
    lines = [json.loads(line) for line in quiet.splitlines() if line.strip()]
    assert lines, "a sidecar that cannot reach its API server warns"
    assert {line["severity"] for line in lines} <= {"warn", "error", "fatal"}
    assert not any("listening on" in line["message"] for line in lines)
