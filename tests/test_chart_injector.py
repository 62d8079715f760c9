"""The chart's sidecar injector (injector.enabled), as `helm template` renders it: its scope,
failure policy, certificates and least privilege. Its effect on a real API server:
e2e/tests/test_injector.py; the injected pod equal to the chart's: test_injection_chart.py."""

from __future__ import annotations

from chart_render import by_kind, one, render
from test_chart_rbac import assert_no_wildcards, rule_table

from kgroup.core.objects import Obj


def operator_env(objs: list[Obj]) -> dict[str, Obj]:
    c = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in c["env"]}


def test_off_by_default_renders_nothing_of_it() -> None:
    objs = render()
    assert not by_kind(objs, "MutatingWebhookConfiguration")
    assert "KGROUP_INJECTOR" not in operator_env(objs)
    services = [s["metadata"]["name"] for s in by_kind(objs, "Service")]
    assert services == ["kg-kgroup-operator-metrics"]


def test_the_webhook_sees_only_labelled_pods_outside_the_operators_namespace() -> None:
    objs = render("injector.enabled=true")
    (hook,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["objectSelector"] == {"matchExpressions": [
        {"key": "kgroup.dev/group", "operator": "Exists"}]}
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    assert set(expr["values"]) == {"kube-system", "kube-node-lease", "kgroup-system"}
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                              "operations": ["CREATE"], "scope": "Namespaced"}]
    assert hook["failurePolicy"] == "Fail" and hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["sideEffects"] == "None" and hook["timeoutSeconds"] == 5
    assert hook["clientConfig"] == {"service": {
        "name": "kg-kgroup-injector", "namespace": "kgroup-system", "path": "/inject",
        "port": 443}}
    # the operator's own pods carry no kgroup.dev/group: not selected twice over
    op_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert "kgroup.dev/group" not in op_labels
    svc = one(objs, "Service", "kg-kgroup-injector")
    assert svc["spec"]["selector"] == one(objs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "injector"


def test_ignore_and_a_further_namespace_selector_are_the_users_choice() -> None:
    objs = render("injector.enabled=true", "injector.failurePolicy=Ignore",
                  "injector.namespaceSelector.matchLabels.team=streaming",
                  "injector.url=https://127.0.0.1:9443/inject")
    (hook,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["namespaceSelector"]["matchLabels"] == {"team": "streaming"}
    assert len(hook["namespaceSelector"]["matchExpressions"]) == 1  # the exclusions stay
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/inject"}


def test_the_operator_listens_on_its_pod_ip_and_may_write_only_its_webhooks_ca() -> None:
    objs = render("injector.enabled=true")
    env = operator_env(objs)
    assert env["KGROUP_INJECTOR"]["value"] == "true"
    assert env["KGROUP_INJECTOR_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["KGROUP_INJECTOR_WEBHOOK"]["value"] == "kg-kgroup-injector"
    assert "kg-kgroup-injector.kgroup-system.svc" in env["KGROUP_INJECTOR_DNS_NAMES"]["value"]
    role = one(objs, "ClusterRole", "kg-kgroup-injector")
    assert_no_wildcards(role["rules"])
    assert rule_table(role["rules"]) == {
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ("get", "patch"),
         ("kg-kgroup-injector",))}
    binding = one(objs, "ClusterRoleBinding", "kg-kgroup-injector")
    assert binding["subjects"][0]["name"] == "kg-kgroup-operator"


def test_the_replicas_share_one_certificate_secret_with_rights_on_it_alone() -> None:
    objs = render("injector.enabled=true")
    env = operator_env(objs)
    assert env["KGROUP_INJECTOR_SECRET"]["value"] == "kg-kgroup-injector-tls"
    secret = one(objs, "Secret", "kg-kgroup-injector-tls")
    assert secret["metadata"]["namespace"] == "kgroup-system"
    assert "data" not in secret and "stringData" not in secret  # the operator fills it
    role = one(objs, "Role", "kg-kgroup-injector")
    assert role["metadata"]["namespace"] == "kgroup-system"
    assert_no_wildcards(role["rules"])
    # no create: the chart renders the Secret; only that one name, read and replaced
    assert rule_table(role["rules"]) == {
        ("", "secrets", ("get", "update"), ("kg-kgroup-injector-tls",))}
    binding = one(objs, "RoleBinding", "kg-kgroup-injector")
    assert binding["roleRef"]["name"] == "kg-kgroup-injector"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kg-kgroup-operator",
                                    "namespace": "kgroup-system"}]
    # with cert-manager, cert-manager writes that Secret: the operator gets no right on it
    cm = render("injector.enabled=true", "injector.certManager.enabled=true")
    assert not [r for r in by_kind(cm, "Role") if r["metadata"]["name"] == "kg-kgroup-injector"]
    assert not by_kind(cm, "Secret")


def test_cert_manager_issues_the_certificate_and_injects_the_ca() -> None:
    objs = render("injector.enabled=true", "injector.certManager.enabled=true")
    mwc = one(objs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "kgroup-system/kg-kgroup-injector"}
    cert = one(objs, "Certificate")
    assert cert["spec"]["secretName"] == "kg-kgroup-injector-tls"
    assert "kg-kgroup-injector.kgroup-system.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": "kg-kgroup-injector", "kind": "Issuer"}
    env = operator_env(objs)
    assert env["KGROUP_INJECTOR_CERT_DIR"]["value"] == "/etc/kgroup/injector-tls"
    assert "KGROUP_INJECTOR_WEBHOOK" not in env
    assert not [r for r in by_kind(objs, "ClusterRole")
                if r["metadata"]["name"] == "kg-kgroup-injector"]
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    tls = {"name": "injector-tls", "secret": {"secretName": "kg-kgroup-injector-tls"}}
    assert tls in pod["volumes"]
