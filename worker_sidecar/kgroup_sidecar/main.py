"""``kgroup-sidecar``: settings from the environment, then the loop until SIGTERM.

Exit status: 0 after a graceful shutdown, 2 on bad settings, 1 on an unexpected error.

The settings are read before anything heavy is imported (aiohttp, prometheus-client: the
program is :mod:`kgroup_sidecar.app`). Before that import, a sidecar in a pod makes the
cluster's CA its process's default trust store (``SSL_CERT_FILE``, read by OpenSSL): the
sidecar opens TLS connections to the API server only, and aiohttp builds a default
context at import which would otherwise load the whole system store (about 2.4 MB and
half a second of CPU per sidecar, for a context it never uses).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from kgroup_sidecar.settings import Settings, SettingsError, load_settings

SERVICE_ACCOUNT_CA = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


def trust_the_cluster_ca(settings: Settings, environ: MutableMapping[str, str],
                         ca: Path = SERVICE_ACCOUNT_CA) -> None:
    """In a pod (no kubeconfig), the service account's CA as the default trust store,
    unless the environment already names one."""
    if settings.kubeconfig is None and "SSL_CERT_FILE" not in environ and ca.is_file():
        environ["SSL_CERT_FILE"] = str(ca)


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"kgroup-sidecar: {exc}", file=sys.stderr)
        return 2
    trust_the_cluster_ca(settings, os.environ)
    from kgroup_sidecar.app import run  # aiohttp and the rest: only now

    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
