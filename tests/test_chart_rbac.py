"""The chart's RBAC and admission policies, as rendered by `helm template` (no cluster).

Why: the chart is where least privilege is decided. RBAC verbs are compared exactly (a
wildcard or an extra verb is a failure), and against the Lease calls the code makes. The
policies' effect on a real API server: e2e/tests/test_admission_*.py.
"""

from __future__ import annotations

import re
from typing import Any

from chart_render import REPO, by_kind, one, render

from kgroup.core.objects import Obj


def rule_table(rules: list[Obj]) -> set[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """(apiGroup, resource, sorted verbs, resourceNames) for every rule's group x resource."""
    table = set()
    for r in rules:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                table.add((g, res, tuple(sorted(r["verbs"])),
                           tuple(r.get("resourceNames", ()))))
    return table


def assert_no_wildcards(rules: list[Obj]) -> None:
    for r in rules:
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in r.get(key, []), f"wildcard in {key}: {r}"


OPERATOR_RULES = {
    ("kgroup.dev", "consumergroups", ("get", "list", "watch"), ()),
    ("kgroup.dev", "consumergroups/status", ("update",), ()),
    ("", "pods", ("list", "watch"), ()),
    ("apps", "statefulsets", ("list", "watch"), ()),
    ("coordination.k8s.io", "leases", ("create", "delete", "get", "list", "patch", "watch"),
     ()),
    ("", "events", ("create",), ()),
    ("apps", "deployments/scale", ("get", "patch"), ()),
    ("apps", "statefulsets/scale", ("get", "patch"), ()),
}


WORKER_RULES = {
    ("coordination.k8s.io", "leases", ("create", "delete", "get", "list", "update", "watch"),
     ()),
    ("kgroup.dev", "consumergroups", ("get", "list", "watch"), ()),
    ("", "events", ("create", "patch"), ()),
}


def test_operator_rbac_is_exactly_what_it_needs() -> None:
    objs = render()
    role = one(objs, "ClusterRole")
    assert_no_wildcards(role["rules"])
    assert rule_table(role["rules"]) == OPERATOR_RULES
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kg-kgroup-operator",
                                    "namespace": "kgroup-system"}]


def test_namespaced_operator_gets_roles_not_a_cluster_role() -> None:
    objs = render("operator.watchNamespaces={orders,billing}")
    assert not by_kind(objs, "ClusterRole") and not by_kind(objs, "ClusterRoleBinding")
    roles = {o["metadata"]["namespace"]: o for o in by_kind(objs, "Role")
             if o["metadata"]["name"] == "kg-kgroup-operator"}
    assert set(roles) == {"orders", "billing"}
    for role in roles.values():
        assert rule_table(role["rules"]) == OPERATOR_RULES


def test_leader_election_role_is_scoped_to_its_lease() -> None:
    objs = render("operator.replicas=2", "operator.leaderElection.leaseName=the-leader")
    role = one(objs, "Role", "kg-kgroup-operator-leader-election")
    assert role["metadata"]["namespace"] == "kgroup-system"
    assert_no_wildcards(role["rules"])
    assert rule_table(role["rules"]) == {
        ("coordination.k8s.io", "leases", ("get", "update"), ("the-leader",)),
        ("coordination.k8s.io", "leases", ("create",), ()),
        ("", "events", ("create", "patch"), ()),
    }
    env = {e["name"]: e.get("value")
           for e in one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KGROUP_LEADER_LEASE"] == "the-leader"


def test_standalone_operator_has_no_leader_election() -> None:
    objs = render("operator.leaderElection.enabled=false", "operator.replicas=1")
    assert not [o for o in by_kind(objs, "Role") if "leader" in o["metadata"]["name"]]
    # more than one replica always elects, whatever leaderElection.enabled says
    assert [o for o in by_kind(render("operator.leaderElection.enabled=false"), "Role")
            if "leader" in o["metadata"]["name"]]
    env = {e["name"]: e.get("value")
           for e in one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KGROUP_PEERING"] == "none"


def test_worker_rbac_is_namespaced_and_minimal() -> None:
    objs = render("workerRbac.namespaces={orders}", "workerRbac.serviceAccountName=orders-w")
    sa = one(objs, "ServiceAccount", "orders-w")
    assert sa["metadata"]["namespace"] == "orders"
    role = one(objs, "Role", "orders-w")
    assert role["metadata"]["namespace"] == "orders"
    assert_no_wildcards(role["rules"])
    assert rule_table(role["rules"]) == WORKER_RULES
    rb = one(objs, "RoleBinding", "orders-w")
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": "orders-w"}
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "orders-w",
                               "namespace": "orders"}]


_VERB = {"list": "list", "create": "create", "replace": "update", "patch": "patch",
         "delete": "delete", "get": "get"}
# Both processes' client (kgroup.apiclient): verb(LEASES, ...), as RBAC verbs; the
# sidecar's watches as data: WatchSpec("kind", LEASES, ...) is a list plus a watch.
_LEASE_CALL = re.compile(r"\.(get|list|create|replace|patch|delete)\(\s*LEASES\b")
# The operator's Lease watch (lease_watch.py, aiohttp): a list, then the list+watch loop
# both processes share (kgroup/kube_watch.py) watches.
_SHARED_WATCH = "kube_watch.follow("
_SIDECAR_WATCH = re.compile(r"WatchSpec\(\s*\"\w+\",\s*LEASES\b")


def lease_verbs_called(*files: str) -> set[str]:
    """Every Lease verb the code in ``files`` calls (a watch adds list and watch)."""
    verbs: set[str] = set()
    for name in files:
        text = (REPO / name).read_text()
        verbs |= {_VERB[m] for m in _LEASE_CALL.findall(text)}
        if _SIDECAR_WATCH.search(text):
            verbs |= {"list", "watch"}
        if _SHARED_WATCH in text or "kopf.on.event(\"coordination.k8s.io\"" in text:
            verbs |= {"list", "watch"}
    return verbs


def lease_verbs_granted(rules: set[Any], names: tuple[str, ...] = ()) -> set[str]:
    return {v for g, res, verbs, rn in rules if (g, res) == ("coordination.k8s.io", "leases")
            and rn == names for v in verbs}


def test_every_lease_verb_granted_is_one_the_code_calls_and_no_more() -> None:
    """RBAC against the code: the operator's group Leases (kube.py, the kopf Lease watch),
    its leader Lease (leader.py), the sidecar's Leases (its kube.py)."""
    operator = lease_verbs_called("operator/kgroup_operator/kube.py",
                                  "operator/kgroup_operator/handlers.py",
                                  "operator/kgroup_operator/lease_watch.py")
    assert operator == {"create", "delete", "get", "list", "patch", "watch"}
    assert lease_verbs_granted(OPERATOR_RULES) == operator
    leader = lease_verbs_called("operator/kgroup_operator/leader.py")
    role = one(render(), "Role", "kg-kgroup-operator-leader-election")
    granted = rule_table(role["rules"])
    assert lease_verbs_granted(granted, ("kgroup-operator-leader",)) | \
        lease_verbs_granted(granted) == leader == {"create", "get", "update"}
    worker = lease_verbs_called("worker_sidecar/kgroup_sidecar/kube.py")
    assert lease_verbs_granted(WORKER_RULES) == worker


# The operator's requests through kgroup.apiclient, as (apiGroup, resource, verb): a verb
# of the client on one of its Resource constants (or through Kube._list, or on either
# scalable kind through _scalable), with its subresource= when it names one.
_CLIENT_CALL = re.compile(r"\.(get|list|create|replace|patch|delete|json_patch|_list)\(\s*"
                          r"(_scalable\(kind\)|[A-Z_]+\b)")
_SUBRESOURCE = re.compile(r"subresource=\"(\w+)\"")
_CLIENT_VERB = {"get": "get", "list": "list", "_list": "list", "create": "create",
                "replace": "update", "patch": "patch", "json_patch": "patch",
                "delete": "delete"}
# Objects outside the operator's ClusterRole: the injector's one Secret and its webhook
# configuration (their own Role and ClusterRole, test_chart_injector.py).
_OUTSIDE_CLUSTER_ROLE = {"SECRETS", "MUTATING_WEBHOOKS"}


def _call_text(text: str, start: int) -> str:
    """The call's text from ``start`` (at its open parenthesis) to its closing one."""
    depth = 0
    for k in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            return text[start:k + 1]
    return text[start:]


def client_calls(text: str) -> set[tuple[str, str, str]]:
    from kgroup import apiclient
    from kgroup_operator.kube import SCALABLE

    calls: set[tuple[str, str, str]] = set()
    for m in _CLIENT_CALL.finditer(text):
        verb, const = m.groups()
        if const in _OUTSIDE_CLUSTER_ROLE or (not hasattr(apiclient, const) and \
                not const.startswith("_scalable")):
            continue
        resources = list(SCALABLE.values()) if const.startswith("_scalable") \
            else [getattr(apiclient, const)]
        sub = _SUBRESOURCE.search(_call_text(text, m.end(1)))
        for res in resources:
            plural = res.plural + (f"/{sub.group(1)}" if sub else "")
            calls.add((res.group, plural, _CLIENT_VERB[verb]))
    return calls


# kopf's event handlers: a list and a watch of the resource
_KOPF_EVENT = re.compile(r"@kopf\.on\.event\(([^)]*)\)")
_KOPF_RESOURCE = {"C.API_GROUP, C.API_VERSION, C.PLURAL": ("kgroup.dev", "consumergroups"),
                  '"v1", "pods"': ("", "pods"),
                  '"apps", "v1", "statefulsets"': ("apps", "statefulsets")}


def operator_calls() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every call the operator's modules make (the client's
    requests, kopf's event handlers, the Lease watches), the leader Lease's aside (its own
    Role, checked above)."""
    calls: set[tuple[str, str, str]] = set()
    for path in sorted((REPO / "operator" / "kgroup_operator").glob("*.py")):
        if path.name == "leader.py":
            continue
        text = path.read_text()
        calls |= client_calls(text)
        for args in _KOPF_EVENT.findall(text):
            group, res = _KOPF_RESOURCE[args.split(", labels")[0]]
            calls |= {(group, res, "list"), (group, res, "watch")}
        if _SHARED_WATCH in text:  # lease_watch.py: a list, then a watch, with aiohttp
            calls |= {("coordination.k8s.io", "leases", v) for v in ("list", "watch")}
    return calls


def test_every_verb_the_operator_is_granted_is_one_its_code_calls_and_no_more() -> None:
    """The operator's RBAC once listed verbs its code never called (patching
    ConsumerGroups and Events). Granted == called, resource by resource."""
    granted = {(g, res, v) for g, res, verbs, _ in rule_table(one(render(), "ClusterRole")[
        "rules"]) for v in verbs}
    assert granted == operator_calls()


def test_the_operator_admission_policy_binds_the_operator_everywhere() -> None:
    objs = render("operator.leaderElection.leaseName=the-leader",
                  "admissionPolicy.namespaces={orders}")
    policy = one(objs, "ValidatingAdmissionPolicy", "kg-kgroup-operator-leases")
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert conditions["caller-is-the-kgroup-operator"] == (
        "request.userInfo.username == 'system:serviceaccount:kgroup-system:kg-kgroup-operator'")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "request.namespace == 'kgroup-system'" in variables["leader"]
    assert "request.name == 'the-leader'" in variables["leader"]
    assert all(v.get("reason") == "Forbidden" for v in policy["spec"]["validations"])
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "kg-kgroup-operator-leases")
    assert binding["spec"] == {"policyName": "kg-kgroup-operator-leases",
                               "validationActions": ["Deny"]}  # every namespace
    assert not [o for o in render("operator.enabled=false")
                if o["metadata"]["name"] == "kg-kgroup-operator-leases"]


def test_admission_policy_binds_the_worker_service_accounts() -> None:
    objs = render("workerRbac.serviceAccountName=orders-w",
                  "admissionPolicy.additionalServiceAccountNames={legacy}",
                  "admissionPolicy.namespaces={orders}")
    policy = one(objs, "ValidatingAdmissionPolicy", "kg-kgroup-lease-ownership")
    assert policy["spec"]["failurePolicy"] == "Fail"
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["leases"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert '["orders-w","legacy"]' in conditions["caller-is-a-kgroup-worker"]
    assert all(v.get("reason") == "Forbidden" for v in policy["spec"]["validations"])
    assert set(conditions) == {"caller-is-a-kgroup-worker"}  # every Lease: kgroup's or not
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "kg-kgroup-lease-ownership")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["orders"]}]


def render_error(*sets: str) -> str:
    from chart_render import CHART, helm
    argv = ["template", "kg", str(CHART), "--namespace", "kgroup-system",
            "--kube-version", "1.35.4", *[a for s in sets for a in ("--set", s)]]
    out = helm(*argv, check=False)
    assert out.returncode != 0, "rendered values that should be refused"
    return str(out.stderr)


def test_worker_rbac_without_the_admission_policy_is_refused() -> None:
    """The chart's values must not leave the workers' writes unchecked."""
    err = render_error("workerRbac.namespaces={orders}", "admissionPolicy.enabled=false")
    assert "workerRbac.namespaces [orders] grants the workers Lease and Event writes that " \
           "only the admission policies limit" in err
    assert "set admissionPolicy.enabled=true" in err


def test_worker_rbac_in_a_namespace_the_policy_does_not_cover_is_refused() -> None:
    err = render_error("workerRbac.namespaces={orders,payments}",
                       "admissionPolicy.namespaces={orders}")
    assert 'workerRbac.namespaces includes "payments" but admissionPolicy.namespaces ' \
           '[orders] does not' in err


def test_consistent_security_values_render() -> None:
    for sets in (("workerRbac.namespaces={orders}", "admissionPolicy.namespaces={orders}"),
                 ("workerRbac.namespaces={orders}",),  # the policies bound everywhere
                 ("admissionPolicy.enabled=false",)):  # no worker RBAC: nothing to check
        assert render(*sets)
