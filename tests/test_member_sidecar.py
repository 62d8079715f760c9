"""The sidecar's pure helpers: settings from the environment, Lease parsing, the audit
checker used by the e2e tests."""

from __future__ import annotations

import pytest

from kgroup.core import lease_codec as objects
from kgroup_sidecar.main import main
from kgroup_sidecar.settings import SettingsError, load_settings
from kgroup_testing.sidecar_harness import ownership_intervals, safety_violations

BASE = {"KGROUP_GROUP": "g", "KGROUP_POD_NAME": "pod-a", "KGROUP_NAMESPACE": "ns"}


def test_settings_defaults() -> None:
    s = load_settings(BASE)
    assert (s.listen_host, s.listen_port, s.log_level, s.audit_file) == (
        "127.0.0.1", 8470, "INFO", None)


@pytest.mark.parametrize("listen", ["0.0.0.0:8470", "10.0.0.1:1", "example.com:80", "8470",
                                    "unix://relative.sock", "http://0.0.0.0:8470"])
def test_settings_refuse_non_loopback_or_malformed_listen(listen: str) -> None:
    with pytest.raises(SettingsError):
        load_settings({**BASE, "KGROUP_LISTEN": listen})


def test_settings_accept_ipv6_loopback() -> None:
    assert load_settings({**BASE, "KGROUP_LISTEN": "[::1]:9000"}).listen_host == "::1"


def test_settings_accept_a_unix_socket() -> None:
    s = load_settings({**BASE, "KGROUP_LISTEN": "unix:///var/run/kgroup/sidecar.sock"})
    assert (s.listen_socket, s.listen) == (
        "/var/run/kgroup/sidecar.sock", "unix:///var/run/kgroup/sidecar.sock")


def test_settings_listen_is_a_client_url() -> None:
    assert load_settings({**BASE, "KGROUP_LISTEN": "http://127.0.0.1:9000"}).listen == (
        "http://127.0.0.1:9000")
    assert load_settings({**BASE, "KGROUP_LISTEN": "[::1]:9000"}).listen == "http://[::1]:9000"


def test_missing_group_exits_2(monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KGROUP_GROUP", raising=False)
    monkeypatch.setenv("KGROUP_POD_NAME", "p")
    assert main([]) == 2
    assert "KGROUP_GROUP" in capsys.readouterr().err


def _partition_lease(notes: dict[str, str], label: str = "3") -> dict[str, object]:
    return {"metadata": {"name": "g-partition-3", "resourceVersion": "7", "annotations": notes,
                         "labels": {"kgroup.dev/role": "partition", "kgroup.dev/partition": label}},
            "spec": {"holderIdentity": "pod-a", "leaseTransitions": 4}}


def test_malformed_position_token_is_treated_as_absent() -> None:
    parsed = objects.parse_partition_lease(
        _partition_lease({"kgroup.dev/position-token": "x", "kgroup.dev/position": "17"}))
    assert parsed.value.position_token is None and parsed.value.position == "17"
    assert parsed.value.token == 4 and parsed.problems


def test_partition_label_not_a_number_is_not_a_lock() -> None:
    assert objects.parse_partition_lease(_partition_lease({}, label="x")).value is None


def test_release_keeps_the_old_position_when_none_is_given() -> None:
    body = _partition_lease({"kgroup.dev/position": "17", "kgroup.dev/session": "S"})
    released = objects.released_partition_lease(body, token=4, position=None)
    assert "holderIdentity" not in released["spec"]
    assert released["metadata"]["annotations"] == {"kgroup.dev/position": "17"}
    moved = objects.released_partition_lease(body, token=4, position="20")
    assert moved["metadata"]["annotations"]["kgroup.dev/position-token"] == "4"


def _rec(mono: float, event: str, session: str, partition: int | None = None,
         token: int | None = None, **extra: object) -> dict[str, object]:
    return {"mono": mono, "event": event, "session": session, "member": f"m-{session}",
            "partition": partition, "token": token, **extra}


def test_audit_accepts_a_clean_handover() -> None:
    records = [_rec(1, "acquire", "A", 0, 1), _rec(2, "release", "A", 0, 1),
               _rec(2.1, "acquire", "B", 0, 2)]
    assert safety_violations(records, now=3) == []


def test_audit_finds_overlap_and_token_regression() -> None:
    records = [_rec(1, "acquire", "A", 0, 2), _rec(1.5, "acquire", "B", 0, 2),
               _rec(3, "release", "A", 0, 2)]
    problems = safety_violations(records, now=4)
    assert any("overlaps" in p for p in problems) and any("after token" in p for p in problems)


def test_audit_ends_a_fenced_interval_at_its_deadline_not_at_the_line() -> None:
    records = [_rec(1, "acquire", "A", 0, 1), _rec(2.5, "acquire", "B", 0, 2),
               _rec(9, "fence", "A", until=2.0, partitions=[[0, 1]])]
    assert safety_violations(records, now=10) == []
    [a, _] = ownership_intervals(records, now=10)
    assert a.end == 2.0
