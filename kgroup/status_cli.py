"""``kgroup status GROUP`` / ``kubectl kgroup status GROUP``: read and print.

Two reads per refresh, as the kubeconfig's user (kubectl's flags: ``-n``, ``--context``,
``--kubeconfig``): the ConsumerGroup, and the group's Leases by label
(``kgroup.dev/group=<group>``); :mod:`kgroup.core.operator.status_view` turns them into the view.
``--watch`` re-reads every ``--interval`` seconds and prints the view again when it
changed (a poll, not a watch stream: a group's member Leases change at every renewal,
and the view keeps only what a person reads). Needs the ``kubernetes`` package (the
``sidecar`` or ``operator`` extra), imported only here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kgroup import constants as C
from kgroup.core.operator.status_view import GroupView, build_view, render_table


class StatusError(Exception):
    """The group cannot be read (not found, forbidden, no cluster): one line, exit 1."""


def _api(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """(ApiClient, the context's namespace or ``default``)."""
    try:
        from kubernetes import config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:  # pragma: no cover - the base install has no kubernetes client
        raise StatusError("kgroup status needs the kubernetes package "
                          "(pip install 'kgroup[sidecar]')") from None
    try:
        contexts, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=kubeconfig)
        chosen = next((c for c in contexts if c["name"] == context), None) if context \
            else active
        if context and chosen is None:
            raise StatusError(f"context {context!r} is not in the kubeconfig")
        api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context)
    except (ConfigException, OSError) as exc:
        raise StatusError(f"cannot load the kubeconfig: {exc}") from None
    namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    return api, namespace


def read_view(api: Any, namespace: str, name: str) -> GroupView:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        group: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
            C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, name)
        leases = client.CoordinationV1Api(api).list_namespaced_lease(
            namespace, label_selector=f"{C.LABEL_GROUP}={name}")
    except ApiException as exc:
        if exc.status == 404:
            raise StatusError(f'consumergroup "{name}" not found in namespace '
                              f'"{namespace}"') from None
        raise StatusError(f"the API server answered {exc.status} {exc.reason}") from None
    except OSError as exc:
        raise StatusError(f"cannot reach the API server: {exc}") from None
    bodies = [api.sanitize_for_serialization(lease) for lease in leases.items]
    return build_view(group, bodies)


def render(view: GroupView, output: str) -> str:
    if output == "json":
        return json.dumps(view.to_dict(), indent=2)
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(view.to_dict(), sort_keys=False)).rstrip("\n")
    return render_table(view)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        api, namespace = _api(args.kubeconfig, args.context)
        namespace = args.namespace or namespace
        last = None
        while True:
            text = render(read_view(api, namespace, args.group), args.output)
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
