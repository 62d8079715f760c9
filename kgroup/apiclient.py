"""kgroup's Kubernetes API client, for the sidecar and the operator: aiohttp straight to
the API server, the library kopf (the operator's framework) talks to it with.

Why not the official ``kubernetes`` package: it is synchronous (a thread per watch and a
thread pool for writes), importing it costs about 10 MB of a sidecar whose whole budget
is 40 MB, and in the operator it cost 40 MB of RSS at 200 members and 133 MB of the image
(docs/design.md, "One Kubernetes client stack per process"). Both processes need a handful
of verbs: list, watch (JSON lines, read by :mod:`kgroup.kube_watch`), get, create,
replace (conditional on a resourceVersion), delete with preconditions, a JSON merge patch
and a JSON patch, on namespaced and cluster-scoped resources and on the ``status`` and
``scale`` subresources.

Configuration, as client-go reads it:

- in a pod: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the service account's CA file and token
  file. The token is projected and rotated by the kubelet (an atomic symlink swap): it is
  re-read whenever the file changes (checked with one ``stat`` per request), so a rotated
  token is used at once;
- a kubeconfig (``KUBECONFIG``, tests and the local runner): a context's (the current one
  unless named) server, ``certificate-authority(-data)``, and ``client-certificate(-data)``
  + ``client-key(-data)`` or ``token``/``tokenFile``. Nothing else (no exec plugins, no
  auth providers). JSON kubeconfigs are read with the standard library; YAML ones with
  PyYAML, imported then.

Errors: an answer other than 2xx raises :class:`ApiError` (its ``status``, and the
``reason`` of the Status body); a request that got no answer raises what aiohttp raises
(``aiohttp.ClientError``, ``TimeoutError``).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp

from kgroup.constants import API_GROUP, API_VERSION, PLURAL
from kgroup.core.objects import Obj

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(Exception):
    """No usable API server configuration (not in a pod, or a kubeconfig without it)."""


class ApiError(Exception):
    """The API server answered with a status other than 2xx."""

    def __init__(self, status: int, reason: str, body: Obj | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body or {}


class Gone(ApiError):
    """410: a version or a list's continue token is too old; list again."""


@dataclass(frozen=True)
class Resource:
    """A resource: ``group`` "" is the core API; ``namespaced`` False for a cluster-scoped
    one (its namespace is then ignored)."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None,
             subresource: str | None = None) -> str:
        """The object's path; the collection's without ``name`` (every namespace's when
        ``namespace`` is None)."""
        base = "/api/" + self.version if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:
            base = f"{base}/namespaces/{quote(namespace, safe='')}"
        path = f"{base}/{self.plural}"
        if name is None:
            return path
        path = f"{path}/{quote(name, safe='')}"
        return path if subresource is None else f"{path}/{subresource}"


LEASES = Resource("coordination.k8s.io", "v1", "leases")
GROUPS = Resource(API_GROUP, API_VERSION, PLURAL)
"""ConsumerGroups."""
EVENTS = Resource("", "v1", "events")
PODS = Resource("", "v1", "pods")
SECRETS = Resource("", "v1", "secrets")
STATEFULSETS = Resource("apps", "v1", "statefulsets")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
MUTATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1",
                             "mutatingwebhookconfigurations", namespaced=False)


class TokenFile:
    """A bearer token read from a file, read again whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""
        self.reads = 0

    def token(self) -> str:
        st = os.stat(self.path)  # follows the projected volume's ..data symlink
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._token = self.path.read_text().strip()
            self._stamp = stamp
            self.reads += 1
        return self._token


@dataclass
class ApiConfig:
    """Where the API server is and how to authenticate to it."""

    server: str
    ssl_context: ssl.SSLContext | bool
    token: str | None = None
    token_file: TokenFile | None = None

    def headers(self) -> dict[str, str]:
        token = self.token_file.token() if self.token_file is not None else self.token
        return {"Authorization": f"Bearer {token}"} if token else {}


def in_cluster_config(environ: Mapping[str, str] | None = None,
                      account: Path = SERVICE_ACCOUNT) -> ApiConfig:
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are not set "
                           "(set KUBECONFIG to run outside one)")
    if ":" in host:
        host = f"[{host}]"
    ctx = ssl.create_default_context(cafile=str(account / "ca.crt"))
    return ApiConfig(server=f"https://{host}:{port}", ssl_context=ctx,
                     token_file=TokenFile(account / "token"))


def _read_config(path: Path) -> Obj:
    text = path.read_text()
    try:
        doc: Obj = json.loads(text)  # the project's kubeconfigs are JSON (valid YAML)
    except ValueError:
        import yaml  # only for a YAML kubeconfig: a pod never reads one

        doc = yaml.safe_load(text)
    return doc


def _named(items: list[Obj], name: str, key: str) -> Obj:
    for item in items or []:
        if item.get("name") == name:
            found: Obj = item.get(key) or {}
            return found
    raise ConfigError(f"kubeconfig: no {key} named {name!r}")


def kubeconfig_context(path: str | Path, context: str | None = None) -> Obj:
    """The named context of a kubeconfig (its current one when ``context`` is None)."""
    doc = _read_config(Path(path))
    return _named(doc.get("contexts") or [], context or str(doc.get("current-context")),
                  "context")


def kubeconfig_config(path: str | Path, context_name: str | None = None) -> ApiConfig:
    """A context of a kubeconfig (its current one by default): server, CA, client
    certificate or token."""
    path = Path(path)
    doc = _read_config(path)
    context = _named(doc.get("contexts") or [], context_name or str(doc.get("current-context")),
                     "context")
    cluster = _named(doc.get("clusters") or [], str(context.get("cluster")), "cluster")
    user = _named(doc.get("users") or [], str(context.get("user")), "user")
    here = path.parent

    def file_of(key: str) -> str | None:
        value = cluster.get(key) if key == "certificate-authority" else user.get(key)
        return str(here / value) if value else None

    ctx: ssl.SSLContext | bool
    if cluster.get("insecure-skip-tls-verify"):
        ctx = False
    elif cluster.get("certificate-authority-data"):  # the cluster's CA only, as client-go
        ctx = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    else:  # a CA file, or else the system's store
        ctx = ssl.create_default_context(cafile=file_of("certificate-authority"))
    if isinstance(ctx, ssl.SSLContext):
        cert, key = user.get("client-certificate-data"), user.get("client-key-data")
        if cert and key:
            _load_chain_data(ctx, base64.b64decode(cert), base64.b64decode(key))
        elif user.get("client-certificate") and user.get("client-key"):
            ctx.load_cert_chain(str(file_of("client-certificate")), file_of("client-key"))
    token_file = TokenFile(Path(str(file_of("tokenFile")))) if user.get("tokenFile") else None
    return ApiConfig(server=str(cluster["server"]).rstrip("/"), ssl_context=ctx,
                     token=user.get("token"), token_file=token_file)


def _load_chain_data(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``ssl`` loads a client certificate from files only: a private temporary directory,
    removed at once."""
    with tempfile.TemporaryDirectory(prefix="kgroup-kc-") as tmp:
        cert_path, key_path = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        ctx.load_cert_chain(str(cert_path), str(key_path))


def load_config(kubeconfig: str | None) -> ApiConfig:
    return kubeconfig_config(kubeconfig) if kubeconfig else in_cluster_config()


def default_config(environ: Mapping[str, str] | None = None,
                   account: Path = SERVICE_ACCOUNT) -> ApiConfig:
    """client-go's rule: ``KUBECONFIG`` (its first file) when set; else the service
    account when in a pod; else ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    kubeconfig = (env.get("KUBECONFIG") or "").split(os.pathsep)[0]
    if kubeconfig:
        return kubeconfig_config(kubeconfig)
    if (account / "token").exists():
        return in_cluster_config(env, account)
    return kubeconfig_config(Path.home() / ".kube" / "config")


def _query(params: Mapping[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in params.items() if v is not None}


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    """A request that may take ``seconds`` in all (connecting at most 2 s of it)."""
    return aiohttp.ClientTimeout(total=seconds, connect=min(2.0, seconds))


class ApiClient:
    """Requests to one API server over one aiohttp session (its own connection pool),
    made at the first request, inside the loop that runs them all; :meth:`close` it when
    done."""

    def __init__(self, config: ApiConfig, *, connections: int = 16) -> None:
        self.config = config
        self.connections = connections
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            connector = aiohttp.TCPConnector(ssl=self.config.ssl_context,
                                             limit=self.connections)
            # no cookies, no proxy from the environment: an API server is reached directly
            self._http = aiohttp.ClientSession(connector=connector,
                                               cookie_jar=aiohttp.DummyCookieJar(),
                                               json_serialize=json.dumps)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def request(self, method: str, path: str, *, timeout: float,
                      params: Mapping[str, str | None] | None = None,
                      body: Obj | list[Obj] | None = None,
                      content_type: str = "application/json") -> Obj:
        """One request; the answer's JSON object (``{}`` for an empty body)."""
        headers = self.config.headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        async with self._session().request(method, self.config.server + path,
                                      params=_query(params or {}), data=data,
                                      headers=headers, timeout=_timeout(timeout)) as resp:
            raw = await resp.read()
            if not 200 <= resp.status < 300:
                raise _error(resp.status, raw)
            answer: Obj = json.loads(raw) if raw else {}
            return answer

    # ---- the verbs (names as the API's own: RBAC is checked against them) ---------------

    async def get(self, res: Resource, namespace: str | None, name: str, *, timeout: float,
                  subresource: str | None = None) -> Obj | None:
        """The object (or its ``subresource``), or None when it does not exist (404).
        Without a resourceVersion: a quorum read, served from etcd."""
        try:
            return await self.request("GET", res.path(namespace, name, subresource),
                                      timeout=timeout)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, res: Resource, namespace: str | None, *, timeout: float,
                   label_selector: str | None = None, field_selector: str | None = None,
                   limit: int | None = None, continue_token: str | None = None) -> Obj:
        """One list answer (every namespace's when ``namespace`` is None); with ``limit``
        one page of at most that many objects, the next asked for with its
        ``metadata.continue`` (the same snapshot: every page carries the first one's
        resourceVersion; a token too old is answered 410 Gone)."""
        return await self.request("GET", res.path(namespace), timeout=timeout, params={
            "labelSelector": label_selector, "fieldSelector": field_selector,
            "limit": None if limit is None else str(limit), "continue": continue_token})

    async def create(self, res: Resource, namespace: str | None, body: Obj, *,
                     timeout: float) -> Obj:
        return await self.request("POST", res.path(namespace), timeout=timeout, body=body)

    async def replace(self, res: Resource, namespace: str | None, body: Obj, *,
                      timeout: float, subresource: str | None = None) -> Obj:
        """PUT; with ``metadata.resourceVersion`` in the body it is conditional (409)."""
        name = str(body["metadata"]["name"])
        return await self.request("PUT", res.path(namespace, name, subresource),
                                  timeout=timeout, body=body)

    async def patch(self, res: Resource, namespace: str | None, name: str, patch: Obj, *,
                    timeout: float, subresource: str | None = None) -> Obj:
        """A JSON merge patch (RFC 7386); with ``metadata.resourceVersion`` in it, it is
        conditional (409)."""
        return await self.request("PATCH", res.path(namespace, name, subresource),
                                  timeout=timeout, body=patch,
                                  content_type="application/merge-patch+json")

    async def json_patch(self, res: Resource, namespace: str | None, name: str,
                         ops: Sequence[Obj], *, timeout: float) -> Obj:
        """A JSON patch (RFC 6902): its ``test`` operations make it conditional (422)."""
        return await self.request("PATCH", res.path(namespace, name), timeout=timeout,
                                  body=[*ops], content_type="application/json-patch+json")

    async def delete(self, res: Resource, namespace: str | None, name: str, *,
                     timeout: float, resource_version: str | None = None,
                     uid: str | None = None) -> bool:
        """Delete; with ``resource_version`` (and ``uid``) only that version of that object
        (409 otherwise). False when it did not exist (404)."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        preconditions = {k: v for k, v in (("resourceVersion", resource_version),
                                            ("uid", uid)) if v}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            await self.request("DELETE", res.path(namespace, name), timeout=timeout, body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def open_watch(self, res: Resource, namespace: str, params: Mapping[str, str | None],
                   *, timeout: aiohttp.ClientTimeout
                   ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """A watch request (``watch=true`` among ``params``), its stream read by
        :mod:`kgroup.kube_watch` (one line bound, 410 Gone, bookmarks, for both
        processes' watches)."""
        return self._session().get(self.config.server + res.path(namespace),
                              params=_query(params), headers=self.config.headers(),
                              timeout=timeout)


def _error(status: int, raw: bytes) -> ApiError:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {"message": raw[:200].decode(errors="replace")}
    return _status_error(status, body if isinstance(body, dict) else {})


def _status_error(status: int, body: Obj) -> ApiError:
    reason = str(body.get("reason") or body.get("message") or "")
    return (Gone if status == 410 else ApiError)(status, reason, body)
