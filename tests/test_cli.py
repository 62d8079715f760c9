"""``kgroup plan``: the table, the JSON, and one clear line plus exit 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kgroup.cli import main

VENV_KGROUP = Path(sys.executable).parent / "kgroup"


def write(tmp_path: Path, data: object) -> str:
    path = tmp_path / "current.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["plan", *argv, "--output", "json"]) == 0
    out = capsys.readouterr().out
    parsed: dict[str, object] = json.loads(out)
    return parsed


def test_json_output_of_an_empty_group_assigns_everything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run_json(capsys, "--partitions", "5", "--members", "b,a")
    assert result == {"assignment": {"a": [0, 1, 2], "b": [3, 4]}, "moved": 5}


def test_json_output_counts_only_partitions_that_change_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = write(tmp_path, {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]})
    result = run_json(capsys, "--partitions", "8", "--current", current, "--members", "a,b,c")
    assert result["moved"] == 2
    assignment = result["assignment"]
    assert isinstance(assignment, dict)
    assert assignment["a"][:2] == [0, 1] and len(assignment["c"]) == 2


def test_range_assignor_ignores_the_current_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = write(tmp_path, {"b": [0, 1], "a": [2, 3]})
    result = run_json(
        capsys, "--partitions", "4", "--current", current, "--members", "a,b", "--assignor", "range"
    )
    assert result == {"assignment": {"a": [0, 1], "b": [2, 3]}, "moved": 4}


def test_table_shows_ranges_counts_changes_and_the_lower_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = write(tmp_path, {"a": list(range(8)), "b": list(range(8, 16))})
    assert main(["plan", "--partitions", "16", "--current", current, "--members", "a,c"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["MEMBER", "PARTITIONS", "COUNT", "CHANGE"]
    assert lines[1].split() == ["a", "0-7", "8", "+0", "-0"]
    assert lines[2].split() == ["b", "(leaving)", "-", "0", "+0", "-8"]
    assert lines[3].split() == ["c", "8-15", "8", "+8", "-0"]
    assert lines[4] == "moved: 8 (lower bound 8)"


def test_an_absent_or_empty_current_file_means_an_empty_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = write(tmp_path, {})
    with_file = run_json(capsys, "--partitions", "3", "--current", empty, "--members", "x")
    without = run_json(capsys, "--partitions", "3", "--members", "x")
    assert with_file == without == {"assignment": {"x": [0, 1, 2]}, "moved": 3}


def error_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Runs a command that must fail: exit 2, nothing on stdout, one line on stderr."""
    assert main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("bad", ["Worker-1", "w_1", "-w", "w-", "a b", "x" * 254])
def test_a_member_name_that_is_no_pod_name_is_refused_saying_what_is_allowed(
    capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    err = error_of(capsys, "--partitions", "4", "--members", f"ok,{bad}")
    assert f"member name {bad!r} is not valid" in err
    assert "lowercase letters, digits, '-' and '.'" in err


def test_a_member_listed_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, "--partitions", "4", "--members", "a,b,a")
    assert "member 'a' is listed twice" in err


def test_no_member_names_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "at least one member" in error_of(capsys, "--partitions", "4", "--members", ",")


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_partitions_below_one_or_not_a_number_is_refused(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    err = error_of(capsys, "--partitions", value, "--members", "a")
    assert "--partitions" in err


def test_a_partition_out_of_range_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = write(tmp_path, {"a": [0, 4]})
    err = error_of(capsys, "--partitions", "4", "--current", current, "--members", "a")
    assert "partition 4 of member 'a' is out of range 0..3" in err


def test_a_partition_listed_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = write(tmp_path, {"a": [0, 1], "b": [1]})
    err = error_of(capsys, "--partitions", "4", "--current", current, "--members", "a,b")
    assert "partition 1 is listed twice (by 'a' and 'b')" in err


@pytest.mark.parametrize(
    "content",
    ['["a"]', '{"a": "0-3"}', '{"a": [0, "1"]}', '{"a": [true]}', '{"a": [1.5]}', "{not json"],
)
def test_a_file_that_is_not_an_object_of_int_lists_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    current = write(tmp_path, content)
    err = error_of(capsys, "--partitions", "4", "--current", current, "--members", "a")
    assert current in err
    assert "JSON" in err


def test_a_missing_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.json")
    err = error_of(capsys, "--partitions", "4", "--current", missing, "--members", "a")
    assert f"cannot read {missing}" in err


def test_an_unknown_assignor_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, "--partitions", "4", "--members", "a", "--assignor", "rr")
    assert "invalid choice: 'rr'" in err


def test_the_installed_console_script_plans_and_refuses(tmp_path: Path) -> None:
    assert VENV_KGROUP.exists(), "the venv's kgroup console script"
    current = write(tmp_path, {"a": [0, 1, 2, 3]})
    ok = subprocess.run(
        [str(VENV_KGROUP), "plan", "--partitions", "4", "--current", current,
         "--members", "a,b", "--output", "json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"assignment": {"a": [0, 1], "b": [2, 3]}, "moved": 2}
    bad = subprocess.run(
        [str(VENV_KGROUP), "plan", "--partitions", "4", "--members", "Bad_Name"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.startswith("kgroup plan: error: member name 'Bad_Name' is not valid")
