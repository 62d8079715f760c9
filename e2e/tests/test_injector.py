"""The sidecar injector on the real API server: the chart's MutatingWebhookConfiguration
(injector.enabled, called at https://127.0.0.1:<port>/inject, scoped to the test's
namespace) and a real kgroup-operator serving it with kopf on 127.0.0.1, its self-made CA
written into the configuration by the operator itself.

Pods are kwok's (nothing connects to them): what is checked is what the API server stores.
"""

from __future__ import annotations

import base64
import json
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from operator_harness import GROUP, OperatorProcess, _free_port
from test_operator import condition, event_reasons, make_group, status_where

from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kgroup"
MARK = "kgroup\\.dev/e2e-injector"  # escaped for helm --set


@dataclass
class Injector:
    op: OperatorProcess
    webhook: str
    core: client.CoreV1Api
    namespace: str
    admission: client.AdmissionregistrationV1Api
    release_namespace: str  # the operator's: never sent to the injector

    def ca_published(self) -> bool:
        cfg: Any = self.admission.read_mutating_webhook_configuration(self.webhook)
        return bool(cfg.webhooks[0].client_config.ca_bundle)

    def set_failure_policy(self, policy: str) -> None:
        self.admission.patch_mutating_webhook_configuration(self.webhook, [
            {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": policy}])


def chart_objects(cluster: Cluster, release_ns: str, mark: str,
                  port: int) -> list[dict[str, Any]]:
    out = cluster.helm(
        "template", f"inj-{secrets.token_hex(3)}", str(CHART), "--namespace", release_ns,
        "--kube-version", "1.35.4", "--set", "crds.enabled=false",
        "--set", "injector.enabled=true", "--set", "admissionPolicy.enabled=false",
        "--set", f"injector.url=https://127.0.0.1:{port}/inject",
        # the two namespaces of this test only (its own and the release's, which the
        # chart excludes by name): the cluster's other tests never meet this webhook
        # --set-string: a mark of digits only ("62262612") would be read as a number
        "--set-string", f"injector.namespaceSelector.matchLabels.{MARK}={mark}",
        check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture
def injector(cluster: Cluster, kube: client.ApiClient, crd: list[str], namespace: str,
             tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Injector]:
    """The chart's webhook configuration and an operator serving it (extra operator
    environment: the test's indirect parameter)."""
    port = _free_port()
    mark = secrets.token_hex(4)
    core = client.CoreV1Api(kube)
    release_ns = f"{namespace[:50]}-rel"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=release_ns, labels={"kgroup.dev/e2e": "true", "kgroup.dev/e2e-injector": mark})))
    core.patch_namespace(namespace, {"metadata": {"labels": {"kgroup.dev/e2e-injector": mark}}})
    objs = chart_objects(cluster, release_ns, mark, port)
    (mwc,) = [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"]
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in
           dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="kgroup-worker")))
    admission = client.AdmissionregistrationV1Api(kube)
    admission.create_mutating_webhook_configuration(cast(Any, mwc))
    op = OperatorProcess(cluster, namespace, tmp_path, env={
        "KGROUP_INJECTOR": "true", "KGROUP_INJECTOR_HOST": "127.0.0.1",
        "KGROUP_INJECTOR_PORT": str(port), "KGROUP_INJECTOR_WEBHOOK": mwc["metadata"]["name"],
        "KGROUP_INJECTOR_SIDECAR": str(env["KGROUP_INJECTOR_SIDECAR"]),
        **getattr(request, "param", {})})
    inj = Injector(op, mwc["metadata"]["name"], core, namespace, admission, release_ns)
    op.start()
    try:
        wait_for("the operator's CA in the webhook configuration", inj.ca_published,
                 timeout=60)
        wait_for("the injector answering", lambda: _answers(inj), timeout=60)
        yield inj
    finally:
        op.stop()
        admission.delete_mutating_webhook_configuration(mwc["metadata"]["name"])
        core.delete_namespace(release_ns, propagation_policy="Background")
        text = op.log_text()
        sys.stdout.write(text[-4000:])
        assert "Traceback" not in text, "the operator logged a traceback"


def _answers(inj: Injector) -> bool:
    try:
        create(inj, f"probe-{secrets.token_hex(2)}", labels={"kgroup.dev/group": GROUP},
               dry_run=True)
    except ApiException:
        return False
    return True


def create(inj: Injector, name: str, *, labels: dict[str, str] | None = None,
           annotations: dict[str, str] | None = None, init: list[Any] | None = None,
           dry_run: bool = False) -> Any:
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations),
        spec=client.V1PodSpec(node_selector={"type": "kwok"}, init_containers=init,
                              containers=[client.V1Container(name="app",
                                                             image="example.invalid/app:1")]))
    if dry_run:
        return inj.core.create_namespaced_pod(inj.namespace, pod, dry_run="All")
    return inj.core.create_namespaced_pod(inj.namespace, pod)


def sidecars(pod: Any) -> list[Any]:
    return [c for c in [*(pod.spec.init_containers or []), *pod.spec.containers]
            if c.name == "kgroup-sidecar"]


def env_of(c: Any) -> dict[str, str | None]:
    return {e.name: e.value for e in c.env or []}


LABEL = {"kgroup.dev/group": GROUP}


def test_a_labelled_pod_gets_the_sidecar_and_others_are_untouched(injector: Injector) -> None:
    pod = create(injector, "labelled", labels=LABEL)
    (side,) = sidecars(pod)
    assert pod.spec.init_containers == [side] and side.restart_policy == "Always"
    assert env_of(side)["KGROUP_GROUP"] == GROUP
    assert side.readiness_probe.http_get.path == "/readyz"
    (app,) = pod.spec.containers
    assert env_of(app)["KGROUP_SIDECAR_URL"] == "unix:///var/run/kgroup/sidecar.sock"
    assert [m.name for m in app.volume_mounts] == ["kgroup-sidecar"]  # and no API token
    assert sorted(v.name for v in pod.spec.volumes) == ["kgroup-sidecar", "kgroup-sidecar-token"]
    assert pod.spec.service_account_name == "kgroup-worker"
    assert pod.spec.automount_service_account_token is False
    assert pod.metadata.annotations["sidecar.kgroup.dev/injected"].startswith(
        "ghcr.io/kgroup/kgroup-sidecar:")

    plain = create(injector, "plain", labels={"app": "other"})
    assert not sidecars(plain) and plain.spec.service_account_name == "default"
    assert [v.name[:16] for v in plain.spec.volumes] == ["kube-api-access-"]  # automount
    assert "sidecar.kgroup.dev/injected" not in (plain.metadata.annotations or {})

    mine = client.V1Container(name="kgroup-sidecar", image="example.invalid/mine:1",
                              restart_policy="Always")
    by_hand = create(injector, "by-hand", labels=LABEL, init=[mine])
    (side,) = sidecars(by_hand)
    assert side.image == "example.invalid/mine:1"
    assert "sidecar.kgroup.dev/injected" not in (by_hand.metadata.annotations or {})


def test_overrides_by_annotation_apply_and_bad_ones_are_refused(injector: Injector) -> None:
    pod = create(injector, "tuned", labels=LABEL, annotations={
        "sidecar.kgroup.dev/log-level": "DEBUG", "sidecar.kgroup.dev/probe-mode": "exec",
        "sidecar.kgroup.dev/resources": json.dumps({"limits": {"memory": "100Mi"}})})
    (side,) = sidecars(pod)
    env = env_of(side)
    assert env["KGROUP_LOG_LEVEL"] == "DEBUG"
    assert env["KGROUP_PROBE_DIR"] == "/var/run/kgroup/probe" and not side.ports
    assert side.startup_probe._exec.command[0] == "find"
    assert side.liveness_probe is None  # exec probes: the sidecar's watchdog instead
    # no requests of its own: the API server takes the limits (the chart's are not merged in)
    assert side.resources.limits == side.resources.requests == {"memory": "100Mi"}
    with pytest.raises(ApiException) as refused:
        create(injector, "typo", labels=LABEL,
               annotations={"sidecar.kgroup.dev/log-levle": "DEBUG"})
    assert refused.value.status == 400
    assert "unknown annotation 'sidecar.kgroup.dev/log-levle'" in str(refused.value.body)


def test_with_the_injector_down_labelled_pods_are_refused_and_nothing_else(
        injector: Injector) -> None:
    injector.op.stop()
    with pytest.raises(ApiException) as refused:
        create(injector, "while-down", labels=LABEL)
    assert "inject.sidecar.kgroup.dev" in str(refused.value.body)
    assert not sidecars(create(injector, "unlabelled-while-down", labels={"app": "x"}))
    # the operator's own namespace is never sent, whatever a pod's labels there
    ours: Any = injector.core.create_namespaced_pod(injector.release_namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="operator-like", labels=LABEL),
        spec=client.V1PodSpec(node_selector={"type": "kwok"}, containers=[
            client.V1Container(name="operator", image="example.invalid/op:1")])))
    assert not sidecars(ours)
    injector.op.start()  # a new certificate, its CA written again: the pod gets in
    pod = wait_for("the labelled pod admitted again", lambda: _try(injector, "after"),
                   timeout=90)
    assert len(sidecars(pod)) == 1


def _try(inj: Injector, name: str) -> Any:
    try:
        return create(inj, name, labels=LABEL)
    except ApiException:
        return None


def test_a_labelled_pod_without_the_sidecar_is_reported_on_its_group(
        injector: Injector, kube: client.ApiClient) -> None:
    make_group(kube, injector.namespace, partitions=2, selector=LABEL)
    # failing open, the injector down: the pod is created bare
    injector.set_failure_policy("Ignore")
    injector.op.stop()
    bare = create(injector, "bare", labels=LABEL)
    assert not sidecars(bare)
    injector.op.start()
    wait_for("SidecarMissing on the group",
             lambda: "SidecarMissing" in event_reasons(kube, injector.namespace), timeout=60)
    events: Any = injector.core.list_namespaced_event(injector.namespace)
    (missing,) = [e for e in events.items if e.reason == "SidecarMissing"]
    assert missing.type == "Warning" and missing.involved_object.name == GROUP
    assert "pod bare" in missing.message
    # and in the group's status, for as long as it runs
    st = status_where(kube, injector.namespace, "SidecarMissing in the status",
                      lambda s: condition(s, "SidecarMissing")[0] == "True", timeout=30)
    assert condition(st, "SidecarMissing") == ("True", "PodsWithoutSidecar")
    assert st["sidecarMissing"] == {"count": 1, "pods": ["bare"]}


def bundle_size(inj: Injector) -> int:
    cfg: Any = inj.admission.read_mutating_webhook_configuration(inj.webhook)
    return str(base64.b64decode(cfg.webhooks[0].client_config.ca_bundle)).count(
        "BEGIN CERTIFICATE")


@pytest.mark.parametrize("injector", [{"KGROUP_INJECTOR_CERT_SECONDS": "30"}], indirect=True)
def test_the_certificate_is_renewed_before_it_expires(injector: Injector) -> None:
    """Valid 30 s: renewed at 20 s (both CAs in the bundle while the server reloads, then
    the new one alone); at 40 s the first certificate has expired and pods get in."""
    start = time.monotonic()
    first: Any = injector.admission.read_mutating_webhook_configuration(injector.webhook)
    wait_for("both CAs in the bundle", lambda: bundle_size(injector) == 2, timeout=40)
    wait_for("the new CA alone", lambda: bundle_size(injector) == 1, timeout=30)
    now: Any = injector.admission.read_mutating_webhook_configuration(injector.webhook)
    assert now.webhooks[0].client_config.ca_bundle != first.webhooks[0].client_config.ca_bundle
    time.sleep(max(0.0, 40 - (time.monotonic() - start)))
    assert len(sidecars(create(injector, "after-expiry", labels=LABEL))) == 1
