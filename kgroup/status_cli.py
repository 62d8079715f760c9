"""``kgroup status GROUP`` / ``kubectl kgroup status GROUP``: read and print.

Two reads per refresh, as the kubeconfig's user (kubectl's flags: ``-n``, ``--context``,
``--kubeconfig``): the ConsumerGroup, and the group's Leases by label
(``kgroup.dev/group=<group>``); :mod:`kgroup.core.operator.status_view` turns them into the view.
``--watch`` re-reads every ``--interval`` seconds and prints the view again when it
changed (a poll, not a watch stream: a group's member Leases change at every renewal,
and the view keeps only what a person reads). Talks to the API server with
:mod:`kgroup.apiclient` (aiohttp: the ``sidecar`` or ``operator`` extra), imported only
here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kgroup import constants as C
from kgroup.core.operator.status_view import GroupView, build_view, render_table


class StatusError(Exception):
    """The group cannot be read (not found, forbidden, no cluster): one line, exit 1."""


READ_TIMEOUT = 30.0


def _config(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """(the API server configuration, the context's namespace or ``default``)."""
    try:
        from kgroup import apiclient
    except ImportError:  # pragma: no cover - the base install has no HTTP client
        raise StatusError("kgroup status needs aiohttp "
                          "(pip install 'kgroup[sidecar]')") from None
    path = kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] \
        or str(Path.home() / ".kube" / "config")
    try:
        chosen = apiclient.kubeconfig_context(path, context)
        config = apiclient.kubeconfig_config(path, context)
    except apiclient.ConfigError:
        if context:
            raise StatusError(f"context {context!r} is not in the kubeconfig") from None
        raise StatusError(f"cannot load the kubeconfig {path}: no current context") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StatusError(f"cannot load the kubeconfig {path}: {exc}") from None
    return config, str(chosen.get("namespace") or "default")


async def _read(config: Any, namespace: str, name: str) -> tuple[Any, list[Any]]:
    from kgroup.apiclient import GROUPS, LEASES, ApiClient

    api = ApiClient(config, connections=2)
    try:
        group = await api.get(GROUPS, namespace, name, timeout=READ_TIMEOUT)
        if group is None:
            return None, []
        leases = await api.list(LEASES, namespace, timeout=READ_TIMEOUT,
                                label_selector=f"{C.LABEL_GROUP}={name}")
        return group, list(leases.get("items") or [])
    finally:
        await api.close()


def read_view(config: Any, namespace: str, name: str) -> GroupView:
    import aiohttp

    from kgroup.apiclient import ApiError

    try:
        group, leases = asyncio.run(_read(config, namespace, name))
    except ApiError as exc:
        raise StatusError(f"the API server answered {exc.status} {exc.reason}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise StatusError(f"cannot reach the API server: {exc or type(exc).__name__}") \
            from None
    if group is None:
        raise StatusError(f'consumergroup "{name}" not found in namespace "{namespace}"')
    return build_view(group, leases)


def render(view: GroupView, output: str) -> str:
    if output == "json":
        return json.dumps(view.to_dict(), indent=2)
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(view.to_dict(), sort_keys=False)).rstrip("\n")
    return render_table(view)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        config, namespace = _config(args.kubeconfig, args.context)
        namespace = args.namespace or namespace
        last = None
        while True:
            text = render(read_view(config, namespace, args.group), args.output)
            if text != last:
                if last is not None and args.output == "table":
                    print()
                print(text, flush=True)
                last = text
            if not args.watch:
                return 0
            time.sleep(args.interval)
    except StatusError as exc:
        print(f"kgroup status: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def add_parser(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="show a group's partitions (owner, state, token, position, lag), members "
             "and conditions",
        description="Read a ConsumerGroup and its Leases from the cluster and show, per "
                    "partition, its owner, state (active/revoking/free/stalled), token, "
                    "position and lag; per member its counts and acknowledged epoch; the "
                    "group's conditions.",
    )
    status.add_argument("group", help="the ConsumerGroup's name")
    status.add_argument("-n", "--namespace", help="default: the context's namespace")
    status.add_argument("--context", help="the kubeconfig context to use")
    status.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    status.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    status.add_argument("-w", "--watch", action="store_true",
                        help="print again whenever the view changes (Ctrl-C to stop)")
    status.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="--watch: seconds between reads (default 2)")
    status.set_defaults(func=cmd_status)
