"""The watchdog's verdict on a clock the test moves, and its setting. The real thing, a
sidecar process whose event loop is stuck, is in e2e/tests/test_sidecar_probes.py."""

from __future__ import annotations

import pytest

from kgroup_sidecar.settings import SettingsError, load_settings
from kgroup_sidecar.watchdog import DEFAULT_LIMIT_SECONDS, EXIT_STATUS, LoopWatchdog

BASE = {"KGROUP_GROUP": "g", "KGROUP_POD_NAME": "p", "KGROUP_NAMESPACE": "ns"}


def test_it_exits_only_once_no_beat_came_for_longer_than_the_limit() -> None:
    now, exits = [0.0], list[int]()
    w = LoopWatchdog(60.0, clock=lambda: now[0], exit=exits.append)
    now[0] = 59.0
    assert not w.check()
    w.beat()
    now[0] = 118.0  # 59 s after that beat
    assert not w.check() and exits == []
    now[0] = 119.5
    assert w.check() and exits == [EXIT_STATUS]


def test_the_setting_defaults_to_60_s_and_0_turns_it_off() -> None:
    assert load_settings(BASE).watchdog_seconds == DEFAULT_LIMIT_SECONDS == 60.0
    assert load_settings({**BASE, "KGROUP_WATCHDOG_SECONDS": "0"}).watchdog_seconds == 0.0
    assert load_settings({**BASE, "KGROUP_WATCHDOG_SECONDS": "5"}).watchdog_seconds == 5.0
    with pytest.raises(SettingsError, match="KGROUP_WATCHDOG_SECONDS"):
        load_settings({**BASE, "KGROUP_WATCHDOG_SECONDS": "-1"})
