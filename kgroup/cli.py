"""The ``kgroup`` command line (also installed as the kubectl plugin ``kubectl-kgroup``).

Rule: subcommands are thin. Each parses and checks its input, calls the pure core, and
prints; bad input is one line on stderr and exit code 2, never a traceback, so the tool
is safe in scripts. New subcommands register themselves in :func:`build_parser`.

``kgroup status GROUP`` reads a group from the cluster (:mod:`kgroup.status_cli`).

``kgroup plan`` answers "what would the operator do?" offline: given a partition count,
the current target and the next members, it prints the next target, what each member
gains and loses, and how many partitions move compared with the least any balanced
assignment could move.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from kgroup.core.operator.assignors import (
    ASSIGNORS,
    Assignee,
    get_assignor,
    lower_bound_moves,
    moved_partitions,
)
from kgroup.core.ranges import format_ranges
from kgroup.status_cli import add_parser as add_status_parser

EXIT_USAGE = 2
# A pod name: a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.').
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_NAME_RULE = (
    "use lowercase letters, digits, '-' and '.', starting and ending with a letter or "
    "digit, at most 253 characters"
)


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors on one line (no usage dump) with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def check_member_name(name: str) -> str:
    if len(name) > 253 or not _NAME.match(name):
        raise UsageError(f"member name {name!r} is not valid: {_NAME_RULE}")
    return name


def parse_members(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--members needs at least one member name, e.g. --members a,b,c")
    seen: set[str] = set()
    for name in names:
        check_member_name(name)
        if name in seen:
            raise UsageError(f"member {name!r} is listed twice in --members")
        seen.add(name)
    return names


def load_current(path: Path | None, partitions: int) -> dict[str, list[int]]:
    """The current target from a JSON file ``{member: [partition, ...]}``, checked."""
    if path is None:
        return {}
    try:
        data: Any = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not JSON: {e.msg} at line {e.lineno}") from None
    shape = "a JSON object mapping member names to lists of partition numbers"
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected {shape}, got {type(data).__name__}")
    current: dict[str, list[int]] = {}
    owner_of: dict[int, str] = {}
    for name, ps in data.items():
        check_member_name(name)
        if not isinstance(ps, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in ps
        ):
            raise UsageError(f"{path}: member {name!r}: expected {shape}")
        for p in ps:
            if not 0 <= p < partitions:
                raise UsageError(
                    f"{path}: partition {p} of member {name!r} is out of range "
                    f"0..{partitions - 1} (--partitions {partitions})"
                )
            if p in owner_of:
                first = owner_of[p]
                where = f"by {first!r} and {name!r}" if first != name else f"by {name!r}"
                raise UsageError(f"{path}: partition {p} is listed twice ({where})")
            owner_of[p] = name
        current[name] = sorted(ps)
    return current


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def render_table(
    current: dict[str, list[int]], after: dict[str, list[int]], moved: int, bound: int
) -> str:
    rows = [("MEMBER", "PARTITIONS", "COUNT", "CHANGE")]
    for name in sorted(set(after) | set(current)):
        before = set(current.get(name, []))
        now = after.get(name)
        ps = now if now is not None else []
        gained = len(set(ps) - before)
        lost = len(before - set(ps))
        label = name if now is not None else f"{name} (leaving)"
        rows.append((label, format_ranges(ps) or "-", str(len(ps)), f"+{gained} -{lost}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows]
    lines.append(f"moved: {moved} (lower bound {bound})")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    names = parse_members(args.members)
    current = load_current(args.current, args.partitions)
    members = [Assignee(n) for n in names]
    after = get_assignor(args.assignor).assign(args.partitions, members, current, {})
    moved = moved_partitions(current, after)
    if args.output == "json":
        print(json.dumps({"assignment": after, "moved": moved}))
    else:
        bound = lower_bound_moves(args.partitions, members, current, {})
        print(render_table(current, after, moved, bound))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kgroup", description="Kubernetes-native consumer groups.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = sub.add_parser(
        "plan",
        help="show the next target assignment for a set of members",
        description="Compute the next target assignment offline, as the operator would.",
    )
    plan.add_argument("--partitions", type=_positive_int, required=True, metavar="N")
    plan.add_argument(
        "--current",
        type=Path,
        metavar="FILE.json",
        help='current target: {"member": [partition, ...]}; absent = empty group',
    )
    plan.add_argument("--members", required=True, help="next members, comma-separated")
    plan.add_argument("--assignor", choices=sorted(ASSIGNORS, reverse=True), default="sticky")
    plan.add_argument("--output", choices=["table", "json"], default="table")
    plan.set_defaults(func=cmd_plan)
    add_status_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help and on bad flags; return instead
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        code: int = args.func(args)
    except UsageError as e:
        print(f"kgroup {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
