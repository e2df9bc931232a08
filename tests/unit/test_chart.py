"""The Helm chart: values schema, `helm template` output, RBAC, Pod security, the generated CRD copy.

The rendering tests need the helm binary (``make bins`` builds it; ``DISPATCH_HELM`` overrides).
Without it they skip, unless ``DISPATCH_REQUIRE_HELM=1`` (set by ``make chart-template``).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dispatch import _constants as k8s_names
from dispatch._backends.slurm import SlurmTenant
from dispatch._backends.slurm._adapter import SlurmConfig
from tests.support.helm import helm_binary, required

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dispatch-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.34.0"
NAMESPACE = "dispatch-system"
RELEASE = "dispatch"
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}
RECOMMENDED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)

# hack/ holds scripts, not a package: import them by path.
sys.path.insert(0, str(REPO / "hack"))
chart_readme = importlib.import_module("chart_readme")
gen_chart = importlib.import_module("gen_chart")


@pytest.fixture(scope="module")
def helm() -> str:
    return required(helm_binary(), "helm", "DISPATCH_REQUIRE_HELM", "run `make bins` or set DISPATCH_HELM")


def template(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [
        helm,
        "template",
        RELEASE,
        str(CHART),
        f"--namespace={NAMESPACE}",
        f"--kube-version={KUBE_VERSION}",
        *args,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm template {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(template(helm, *args).stdout) if d is not None]
    for d in docs:
        assert isinstance(d, dict), d
        assert d.get("apiVersion"), d
        assert d.get("kind"), d
        assert d.get("metadata", {}).get("name"), d
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return container


def deployment_args(docs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = operator_container(docs)["args"]
    return args


# ---- values and schema (no helm needed) --------------------------------------------------


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def _object_schemas(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield path or "/", node
        for key, child in node.items():
            yield from _object_schemas(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _object_schemas(child, f"{path}/{i}")


def test_default_values_and_ci_values_satisfy_the_schema() -> None:
    validator = jsonschema.Draft7Validator(_schema())
    validator.validate(_values())
    for path in CI_VALUES:
        validator.validate(yaml.safe_load(path.read_text()) or {})


def test_every_object_in_the_schema_rejects_unknown_keys() -> None:
    """`additionalProperties: false` on every object with named keys; the free-form maps
    (labels, annotations, nodeSelector) allow only string values; the rest is Kubernetes' own
    types (affinity terms) or the Slurm backend's settings (validated by the operator)."""
    passthrough = {
        "/properties/slurm/properties/extraConfig",
        "/properties/affinity/properties/nodeAffinity",
        "/properties/affinity/properties/podAffinity",
        "/properties/affinity/properties/podAntiAffinity",
    }
    for path, node in _object_schemas(_schema()):
        if path in passthrough:
            continue
        extra = node.get("additionalProperties")
        if "properties" in node or path == "/":
            assert extra is False, f"{path}: additionalProperties must be false"
        else:
            assert extra == {"type": "string"}, f"{path}: a map must say what its values are"


@pytest.mark.parametrize(
    "values",
    [
        {"replica": 2},
        {"image": {"repo": "x"}},
        {"slurm": {"tokenSecret": {"namespace": "x"}}},
        {"metrics": {"serviceMonitor": {"scrapeInterval": "1m"}}},
        {"podLabels": {"a": 1}},
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"logFormat": "xml"},
    ],
)
def test_schema_rejects_unknown_keys_and_bad_values(values: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_schema()).validate({**_values(), **values})


def test_schema_and_values_list_the_same_keys() -> None:
    def keys(values: Any, schema: dict[str, Any], path: str) -> None:
        props = schema.get("properties")
        if not isinstance(values, dict) or props is None:
            return
        assert set(values) <= set(props), (
            f"{path or '/'}: {sorted(set(values) - set(props))} not in the schema"
        )
        if not path.startswith(("/resources", "/affinity")):  # documented as a whole
            assert set(values) == set(props), (
                f"{path or '/'}: {sorted(set(props) - set(values))} not in values"
            )
        for k, v in values.items():
            keys(v, props[k], f"{path}/{k}")

    keys(_values(), _schema(), "")


def test_every_value_is_documented_and_the_readme_is_fresh() -> None:
    documented = {v.path for v in chart_readme.parse((CHART / "values.yaml").read_text())}
    assert {
        "replicas",
        "watchNamespaces",
        "slurm.url",
        "slurm.tokenSecret.name",
        "crds.install",
    } <= documented
    assert (CHART / "README.md").read_text() == chart_readme.render(), "run `make generate`"


def test_readme_generator_refuses_an_undocumented_value() -> None:
    with pytest.raises(chart_readme.UndocumentedValue, match=r"`b\.c`"):
        chart_readme.parse("# -- documented\na: 1\nb:\n  c: 2\n")


def test_chart_crd_template_is_generated_from_crds() -> None:
    rel = gen_chart.CRDS_TEMPLATE
    assert (REPO / rel).read_text() == gen_chart.render_crds(), "run `make generate`"


def test_chart_versions() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == "0.1.0"
    assert chart["kubeVersion"]


# ---- helm template -----------------------------------------------------------------------


@pytest.mark.parametrize("values_file", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_every_rendered_object_parses_and_carries_the_recommended_labels(
    helm: str, values_file: Path
) -> None:
    docs = render(helm, "-f", str(values_file))
    assert docs
    for d in docs:
        labels = d["metadata"].get("labels", {})
        missing = [k for k in RECOMMENDED_LABELS if k not in labels]
        assert not missing, f"{d['kind']}/{d['metadata']['name']} lacks {missing}"
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"].get("namespace"), f"{d['kind']}/{d['metadata']['name']} has no namespace"


@pytest.mark.parametrize(
    "args",
    [
        ("--set", "unknownKey=1"),
        ("--set", "image.bogus=1"),
        ("--set", "slurm.tokenSecret.namespace=x"),
        ("--set", "replicas=-1"),
    ],
)
def test_helm_rejects_unknown_keys(helm: str, args: tuple[str, ...]) -> None:
    proc = template(helm, *args, check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr


def test_pod_meets_the_restricted_pod_security_standard(helm: str) -> None:
    pod = one(render(helm), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host)
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    assert all(set(v) & {"emptyDir", "configMap", "secret", "projected"} for v in volumes.values())


def test_replicas_and_leader_election(helm: str) -> None:
    single = render(helm)
    assert one(single, "Deployment")["spec"]["replicas"] == 1
    assert "--leader-elect" not in deployment_args(single)
    assert one(single, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert not [r for r in by_kind(single, "Role") if r["metadata"]["name"].endswith("leader-election")]
    for args in (("--set", "replicas=2"), ("--set", "leaderElection.enabled=true")):
        docs = render(helm, *args)
        argv = deployment_args(docs)
        assert "--leader-elect" in argv
        assert f"--lease-namespace={NAMESPACE}" in argv
        assert f"--lease-name={k8s_names.LEASE_NAME}" in argv
        role = one(docs, "Role", f"{RELEASE}-dispatch-operator-leader-election")
        assert role["metadata"]["namespace"] == NAMESPACE
        assert role["rules"] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ]


def test_the_settled_ttl_default_is_passed_only_when_set(helm: str) -> None:
    assert not [a for a in deployment_args(render(helm)) if a.startswith("--settled-ttl-seconds")]
    for ttl in ("0", "604800"):
        argv = deployment_args(render(helm, "--set", f"settledTTLSeconds={ttl}"))
        assert f"--settled-ttl-seconds={ttl}" in argv


def _rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for d in docs if d["kind"] in {"Role", "ClusterRole"} for rule in d.get("rules", [])]


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


@pytest.mark.parametrize("values_file", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_rbac_has_no_wildcards(helm: str, values_file: Path) -> None:
    for rule in _rules(render(helm, "-f", str(values_file))):
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in rule.get(field, []), rule
            assert not any("*" in item for item in rule.get(field, [])), rule


def test_operator_rbac_is_exactly_what_it_needs(helm: str) -> None:
    docs = render(helm)
    operator_roles = [
        d
        for d in by_kind(docs, "ClusterRole")
        if d["metadata"]["name"]
        in {
            f"{RELEASE}-dispatch-operator",
            f"{RELEASE}-dispatch-operator-kopf",
            f"{RELEASE}-dispatch-operator-cluster",
        }
    ]
    assert _grants(_rules(operator_roles)) == {
        *(("dispatch.dev", "dispatchjobs", v) for v in ("get", "list", "watch", "patch", "delete")),
        *(("dispatch.dev", "dispatchjobs/status", v) for v in ("get", "update", "patch")),
        ("dispatch.dev", "dispatchjobs/finalizers", "update"),
        *(("kubeflow.org", "pytorchjobs", v) for v in ("create", "get", "list", "watch", "patch", "delete")),
        *(("", "pods", v) for v in ("get", "list", "watch", "delete", "deletecollection")),
        *((g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")),
        *(("", "events", v) for v in ("list", "watch")),  # the kit's disruption Events
        ("", "nodes", "get"),
        *(("kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "watch")),  # read only
        *(("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")),
    }
    grants = _grants(_rules(docs))
    assert not [g for g in grants if g[1] == "secrets"], "the operator never reads Secrets"
    binding = one(docs, "ClusterRoleBinding", f"{RELEASE}-dispatch-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-dispatch-operator", "namespace": NAMESPACE}
    ]


def _operator_grants(docs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    names = {f"{RELEASE}-dispatch-operator", f"{RELEASE}-dispatch-operator-cluster"}
    return _grants(_rules([d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] in names]))


def test_the_backends_value_grants_exactly_the_enabled_backends_rules(helm: str) -> None:
    """Each enabled backend adds exactly its registry entry's rules and one --backend flag; none
    enabled adds no rule and passes --backend none (the operator then opens no Kubernetes backend)."""
    from dispatch import _registry
    from dispatch._controller.main import enabled_backends, parser

    base = _operator_grants(render(helm, "--set", "backends=null"))
    assert "--backend=none" in deployment_args(render(helm, "--set", "backends=null"))
    assert not [g for g in base if g[1] in ("pods", "pytorchjobs", "nodes")]
    for info in _registry.kubernetes_backends():
        docs = render(helm, "--set", f"backends={{{info.name}}}")
        declared = _grants([r.as_dict() for r in info.rbac])
        assert _operator_grants(docs) - base == declared - base, info.name
        assert enabled_backends(parser().parse_args(deployment_args(docs))) == [info.name]
    refused = template(helm, "--set", "backends={no-such-backend}", check=False)
    assert refused.returncode != 0
    assert "backends" in refused.stderr


def test_watch_namespaces_gives_roles_per_namespace_and_nothing_cluster_wide_for_jobs(helm: str) -> None:
    docs = render(helm, "--set", "watchNamespaces={team-a,team-b}")
    assert "--all-namespaces" not in deployment_args(docs)
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(deployment_args(docs))
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == f"{RELEASE}-dispatch-operator"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [
        b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == f"{RELEASE}-dispatch-operator"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    cluster_rules = _rules(
        [
            d
            for d in by_kind(docs, "ClusterRole")
            if not d["metadata"]["name"].endswith(("-viewer", "-editor"))
        ]
    )
    # Cluster-scoped by nature, so never per namespace: kopf's CRD and namespace watches, and the
    # nodes a backend reads (whether a pod's node is gone).
    assert {g[1] for g in _grants(cluster_rules)} == {"customresourcedefinitions", "namespaces", "nodes"}
    assert "--all-namespaces" in deployment_args(render(helm))


def test_viewer_and_editor_aggregate_into_the_built_in_roles(helm: str) -> None:
    docs = render(helm)
    viewer = one(docs, "ClusterRole", f"{RELEASE}-dispatch-operator-viewer")
    editor = one(docs, "ClusterRole", f"{RELEASE}-dispatch-operator-editor")
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert {v for _, _, v in _grants(viewer["rules"])} == {"get", "list", "watch"}
    assert ("dispatch.dev", "dispatchjobs/status", "update") not in _grants(editor["rules"])
    assert ("dispatch.dev", "dispatchjobs", "create") in _grants(editor["rules"])
    names = {d["metadata"]["name"] for d in render(helm, "--set", "rbac.aggregateToDefaultRoles=false")}
    assert f"{RELEASE}-dispatch-operator-viewer" not in names


def test_crd_is_the_generated_one_kept_on_uninstall_and_optional(helm: str) -> None:
    docs = render(helm)
    crd = one(docs, "CustomResourceDefinition", k8s_names.CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    source = yaml.safe_load((REPO / "crds" / "dispatch.dev_dispatchjobs.yaml").read_text())
    assert crd["spec"] == source["spec"]
    assert not by_kind(render(helm, "--set", "crds.install=false"), "CustomResourceDefinition")
    unkept = one(render(helm, "--set", "crds.keep=false"), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in (unkept["metadata"].get("annotations") or {})


def test_slurm_config_is_a_valid_backend_config_with_the_token_as_a_file(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "slurm-values.yaml"))
    cm = one(docs, "ConfigMap", f"{RELEASE}-dispatch-operator-slurm")
    config = SlurmConfig.model_validate(yaml.safe_load(cm["data"]["slurm.yaml"]))
    assert config.url == "http://slurmrestd.slurm.svc:6820"
    assert config.api_version == "v0.0.41"
    assert config.token is None
    assert config.token_file == "/var/run/secrets/dispatch.dev/slurm/token"
    assert config.poll_interval == 5
    # Relative to the job's working directory and without %x (the Slurm job name holds a "/").
    assert config.standard_output == "dispatch-%j.out"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "--slurm-config=/etc/dispatch/slurm.yaml" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["slurm-config"] == "/etc/dispatch"
    assert mounts["slurm-token"] == "/var/run/secrets/dispatch.dev/slurm"
    secret = next(v for v in pod["volumes"] if v["name"] == "slurm-token")["secret"]
    assert secret["secretName"] == "slurm-jwt"
    assert secret["items"] == [{"key": "token", "path": "token"}]
    assert all("slurm" not in e["name"].lower() for e in container["env"]), "no token in the environment"
    assert "checksum/slurm-config" in one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    chosen = render(
        helm,
        "-f",
        str(CHART / "ci" / "slurm-values.yaml"),
        "--set",
        "slurm.extraConfig.standard_output=/o/%j",
    )
    cm = one(chosen, "ConfigMap", f"{RELEASE}-dispatch-operator-slurm")
    assert yaml.safe_load(cm["data"]["slurm.yaml"])["standard_output"] == "/o/%j"


def test_slurm_identities_are_valid_tenants_each_with_its_token_secret_as_a_file(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "slurm-tenants-values.yaml"))
    cm = one(docs, "ConfigMap", f"{RELEASE}-dispatch-operator-slurm")
    config = SlurmConfig.model_validate(yaml.safe_load(cm["data"]["slurm.yaml"]))
    assert [(t.name, t.user_name, t.token_file) for t in config.tenants] == [
        ("team-a", "alice", "/var/run/secrets/dispatch.dev/slurm-tenants/0/token"),
        ("research", "bob", "/var/run/secrets/dispatch.dev/slurm-tenants/1/token"),
    ]
    assert config.tenants[0].working_directories == ("/scratch/team-a",)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["slurm-tenant-1"] == "/var/run/secrets/dispatch.dev/slurm-tenants/1"
    secret = next(v for v in pod["volumes"] if v["name"] == "slurm-tenant-1")["secret"]
    assert (secret["secretName"], secret["items"]) == (
        "slurm-research-jwt",
        [{"key": "jwt", "path": "token"}],
    )
    tenant_schema = _schema()["properties"]["slurm"]["properties"]["tenants"]["items"]["properties"]
    assert set(tenant_schema) == set(SlurmTenant.model_fields) - {"token", "token_file"} | {"tokenSecret"}
    proc = template(
        helm,
        "-f",
        str(CHART / "ci" / "slurm-tenants-values.yaml"),
        "--set",
        "slurm.tenants[0].token=t",
        check=False,
    )
    assert proc.returncode != 0
    assert "additional properties 'token' not allowed" in proc.stderr


def test_slurm_token_never_goes_into_the_config_map(helm: str) -> None:
    proc = template(
        helm,
        "--set",
        "slurm.enabled=true",
        "--set",
        "slurm.url=http://x:6820",
        "--set",
        "slurm.extraConfig.token=t",
        check=False,
    )
    assert proc.returncode != 0
    assert "tokenSecret" in proc.stderr
    assert template(helm, "--set", "slurm.enabled=true", check=False).returncode != 0  # url required


def test_metrics_port_names_line_up(helm: str) -> None:
    docs = render(helm, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.port=9090")
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0] == {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}
    assert "--metrics-port=9090" in container["args"]
    service = one(docs, "Service", f"{RELEASE}-dispatch-operator-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["ports"][0]["name"] == "metrics"
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    off = render(helm, "--set", "metrics.enabled=false")
    assert [s["metadata"]["name"] for s in by_kind(off, "Service")] == [
        f"{RELEASE}-dispatch-operator-webhook"
    ]
    assert "metrics" not in {p["name"] for p in operator_container(off).get("ports", [])}
    assert not [a for a in deployment_args(off) if a.startswith("--metrics-port")]


def test_selector_matches_the_pod_labels(helm: str) -> None:
    deployment = one(render(helm, "--set", "podLabels.team=ml"), "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert labels["team"] == "ml"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"{RELEASE}-dispatch-operator"


# ---- admission webhooks, metrics flags, probes -------------------------------------------

FULLNAME = f"{RELEASE}-dispatch-operator"
WEBHOOK_SERVICE = f"{FULLNAME}-webhook"
OPERATOR_ACCOUNT = FULLNAME  # the chart's default service account
WEBHOOK_SECRET = f"{FULLNAME}-webhook-tls"
WEBHOOK_KINDS = {
    "ValidatingWebhookConfiguration": k8s_names.WEBHOOK_VALIDATE_ID,
    "MutatingWebhookConfiguration": k8s_names.WEBHOOK_MUTATE_ID,
}


def _webhook(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    config = one(docs, kind, FULLNAME)
    webhooks: list[dict[str, Any]] = config["webhooks"]
    assert len(webhooks) == 1
    return webhooks[0]


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return pod


def test_webhook_configurations_are_the_documented_ones(helm: str) -> None:
    """docs/observability.md: names, paths, rules, sideEffects, review versions, failure policy."""
    docs = render(helm)
    for kind, webhook_id in WEBHOOK_KINDS.items():
        webhook = _webhook(docs, kind)
        assert webhook["name"] == f"{webhook_id}.{k8s_names.GROUP}"
        assert webhook["clientConfig"]["service"] == {
            "name": WEBHOOK_SERVICE,
            "namespace": NAMESPACE,
            "path": f"/{webhook_id}",
            "port": 443,
        }
        assert webhook["rules"] == [
            {
                "apiGroups": [k8s_names.GROUP],
                "apiVersions": [k8s_names.VERSION],
                "resources": [k8s_names.PLURAL],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }
        ]
        assert webhook["sideEffects"] == "None"
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["failurePolicy"] == "Fail"
        assert webhook["timeoutSeconds"] == 10
        assert "namespaceSelector" not in webhook  # every namespace: the operator watches them all
        assert "objectSelector" not in webhook  # a label must not be a way around the webhooks
        # The operator's own writes (its finalizer's removal) never wait for its own webhook.
        (condition,) = webhook["matchConditions"]
        assert condition["expression"] == (
            f'request.userInfo.username != "system:serviceaccount:{NAMESPACE}:{OPERATOR_ACCOUNT}"'
        )


def test_webhook_values_change_policy_timeout_namespaces_and_annotations(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "webhook.failurePolicy=Ignore",
        "--set",
        "webhook.timeoutSeconds=5",
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "webhook.annotations.cert-manager\\.io/inject-ca-from=dispatch-system/webhook",
    )
    for kind in WEBHOOK_KINDS:
        webhook = _webhook(docs, kind)
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["timeoutSeconds"] == 5
        # Only the namespaces this release supervises: another release may watch the others.
        assert webhook["namespaceSelector"] == {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
            ]
        }
        annotations = one(docs, kind, FULLNAME)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": "dispatch-system/webhook"}


def _handshake(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, hostname: str, tmp_path: Path) -> None:
    """A TLS handshake as the API server makes it: trusting only the CA, checking the host name."""
    import socket
    import ssl
    import threading

    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(key_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_ctx = ssl.create_default_context(cadata=ca_pem.decode())
    left, right = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(left, server_side=True) as s:
                s.sendall(b"ok")
        except BaseException as error:  # reported by the client side's assertion
            errors.append(error)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with client_ctx.wrap_socket(right, server_hostname=hostname) as c:
        assert c.recv(2) == b"ok"
    thread.join()
    assert not errors, errors


def test_generated_certificate_serves_the_service_and_the_ca_bundle_is_its_ca(
    helm: str, tmp_path: Path
) -> None:
    import base64

    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
    )

    docs = render(helm)
    secret = one(docs, "Secret", WEBHOOK_SECRET)
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["namespace"] == NAMESPACE
    data = secret["data"]
    assert set(data) == {"tls.crt", "tls.key", "ca.crt"}
    for kind in WEBHOOK_KINDS:
        assert _webhook(docs, kind)["clientConfig"]["caBundle"] == data["ca.crt"]
    cert_pem, key_pem, ca_pem = (base64.b64decode(data[k]) for k in ("tls.crt", "tls.key", "ca.crt"))
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    host = f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"
    assert set(dns.get_values_for_type(x509.DNSName)) == {
        WEBHOOK_SERVICE,
        f"{WEBHOOK_SERVICE}.{NAMESPACE}",
        host,
        f"{host}.cluster.local",
    }
    key = load_pem_private_key(key_pem, password=None)
    spki = (Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)
    validity = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert validity.days >= 364, "webhook.certValidityDays"
    _handshake(cert_pem, key_pem, ca_pem, host, tmp_path)


def test_deployment_serves_the_webhook_with_the_mounted_certificate(
    helm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatch._controller import webhook as webhook_module

    docs = render(helm)
    pod = _pod(docs)
    container = operator_container(docs)
    assert f"--webhook-port={k8s_names.WEBHOOK_PORT}" in container["args"]
    assert "--max-jobs=40000" in container["args"]  # the memory bound (docs/operator.md)
    assert {"name": "webhook", "containerPort": k8s_names.WEBHOOK_PORT, "protocol": "TCP"} in container[
        "ports"
    ]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert mount["readOnly"] is True
    assert "subPath" not in mount  # a renewed certificate must reach the Pod
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == WEBHOOK_SECRET
    assert "items" not in volume["secret"]  # tls.crt, tls.key and (optional) ca.crt
    # main.py does not add webhook.add_arguments' flags: the cert dir goes through the environment
    # variable dispatch._controller.webhook reads (it falls back to it when the flag is not given).
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[f"{webhook_module.ENV_PREFIX}CERT_DIR"] == mount["mountPath"]
    for name, value in env.items():
        if name.startswith(webhook_module.ENV_PREFIX):
            assert value is not None
            monkeypatch.setenv(name, value)
    options = webhook_module.options(k8s_names.WEBHOOK_PORT)
    assert options.cert_dir == Path(mount["mountPath"])
    assert options.managed is None  # the chart installs the configurations: no RBAC for them
    names = {(options.cert_dir / f).name for f in (webhook_module.CERT_FILE, webhook_module.KEY_FILE)}
    assert names <= set(one(docs, "Secret", WEBHOOK_SECRET)["data"])


def test_webhook_service_selects_the_operator_pod(helm: str) -> None:
    docs = render(helm, "--set", "podLabels.team=ml")
    service = one(docs, "Service", WEBHOOK_SERVICE)
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert "webhook" in {p["name"] for p in operator_container(docs)["ports"]}
    # A different container port still lines up (the Service targets the port by name).
    other = render(helm, "--set", "webhook.port=10443")
    assert "--webhook-port=10443" in deployment_args(other)
    assert {"name": "webhook", "containerPort": 10443, "protocol": "TCP"} in operator_container(other)[
        "ports"
    ]


def test_webhook_with_an_existing_secret(helm: str) -> None:
    docs = render(helm, "--set", "webhook.certSecret=my-cert", "--set", "webhook.caBundle=Q0E=")
    assert not [s for s in by_kind(docs, "Secret")], "the chart generates nothing"
    volume = next(v for v in _pod(docs)["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == "my-cert"
    for kind in WEBHOOK_KINDS:
        assert _webhook(docs, kind)["clientConfig"]["caBundle"] == "Q0E="
    # No CA given and no cluster to read the Secret from (helm template): left to a CA injector.
    injected = render(helm, "--set", "webhook.certSecret=my-cert")
    for kind in WEBHOOK_KINDS:
        assert "caBundle" not in _webhook(injected, kind)["clientConfig"]


def test_webhook_disabled_installs_nothing_of_it(helm: str) -> None:
    docs = render(helm, "--set", "webhook.enabled=false")
    for kind in WEBHOOK_KINDS:
        assert not by_kind(docs, kind)
    assert not by_kind(docs, "Secret")
    assert WEBHOOK_SERVICE not in {s["metadata"]["name"] for s in by_kind(docs, "Service")}
    container = operator_container(docs)
    assert not [a for a in container["args"] if a.startswith("--webhook")]
    assert not [e for e in container["env"] if e["name"].startswith("DISPATCH_WEBHOOK_")]
    assert "webhook" not in {p["name"] for p in container.get("ports", [])}
    assert "webhook-tls" not in {v["name"] for v in _pod(docs)["volumes"]}
    # Nothing at all to serve: no ports list.
    bare = render(
        helm,
        "--set",
        "webhook.enabled=false",
        "--set",
        "metrics.enabled=false",
        "--set",
        "probes.enabled=false",
    )
    assert "ports" not in operator_container(bare)


def test_webhook_needs_no_extra_rbac(helm: str) -> None:
    """Not managed by the operator (no --webhook-managed): nothing on admissionregistration."""
    on, off = render(helm), render(helm, "--set", "webhook.enabled=false")
    assert _grants(_rules(on)) == _grants(_rules(off))
    assert not [g for g in _grants(_rules(on)) if g[0] == "admissionregistration.k8s.io"]


@pytest.mark.parametrize(
    "values",
    [
        {"webhook": {"enable": True}},
        {"webhook": {"failurePolicy": "Maybe"}},
        {"webhook": {"timeoutSeconds": 31}},
        {"webhook": {"certSecret": "Not_A_Name"}},
        {"webhook": {"caBundle": "not base64!"}},
        {"webhook": {"annotations": {"a": 1}}},
        {"webhook": {"service": {"port": 443}}},
        {"probes": {"path": "/healthz"}},
        {"probes": {"port": 0}},
    ],
)
def test_schema_rejects_unknown_and_bad_webhook_and_probe_values(values: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_schema()).validate({**_values(), **values})


@pytest.mark.parametrize(
    "value", ["webhook.bogus=1", "webhook.failurePolicy=Maybe", "probes.livenessPath=/x"]
)
def test_helm_rejects_unknown_webhook_keys(helm: str, value: str) -> None:
    proc = template(helm, "--set", value, check=False)
    assert proc.returncode != 0
    assert "schema" in proc.stderr


@pytest.mark.parametrize("values_file", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_the_operator_accepts_every_flag_the_chart_passes(helm: str, values_file: Path) -> None:
    """The Deployment's args parse with dispatch-operator's own parser (main.py), so a renamed or
    missing flag fails here rather than in a crash-looping Pod."""
    from dispatch._controller.main import parser

    docs = render(helm, "-f", str(values_file))
    args = parser().parse_args(deployment_args(docs))
    values = yaml.safe_load(values_file.read_text()) or {}
    metrics = {**_values()["metrics"], **values.get("metrics", {})}
    webhook = {**_values()["webhook"], **values.get("webhook", {})}
    probes = {**_values()["probes"], **values.get("probes", {})}
    assert args.metrics_port == (metrics["port"] if metrics["enabled"] else 0)
    assert args.webhook_port == (webhook["port"] if webhook["enabled"] else 0)
    assert args.health_port == (probes["port"] if probes["enabled"] else 0)


def test_the_chart_defaults_are_the_operators_and_its_values_reach_the_flags(helm: str) -> None:
    """The write limit and the loop's workers: the chart's defaults equal the flags' own (one
    default, not two that drift), and a value set in the chart is what the operator parses."""
    from dispatch._controller.main import check_arguments, parser

    defaults = parser().parse_args([])
    args = parser().parse_args(deployment_args(render(helm)))
    check_arguments(args)
    for name in ("write_qps", "write_burst", "workers"):
        assert getattr(args, name) == getattr(defaults, name), name
    docs = render(helm, "--set", "workers=128", "--set", "writeLimit.qps=0")
    args = parser().parse_args(deployment_args(docs))
    assert (args.workers, args.write_qps) == (128, 0)
    refused = template(helm, "--set", "workers=0", check=False)
    assert refused.returncode != 0
    assert "workers" in refused.stderr


def test_metrics_service_and_service_monitor_match_the_flag(helm: str) -> None:
    from dispatch._controller.main import parser

    docs = render(helm, "--set", "metrics.serviceMonitor.enabled=true")
    assert parser().parse_args(deployment_args(docs)).metrics_port == 8080
    service = one(docs, "Service", f"{FULLNAME}-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in operator_container(docs)["ports"]
    monitor = one(docs, "ServiceMonitor", FULLNAME)
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == k8s_names.METRICS_PATH
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    # The webhook Service carries the same labels but no `metrics` port: it yields no target.
    assert "metrics" not in {p["name"] for p in one(docs, "Service", WEBHOOK_SERVICE)["spec"]["ports"]}
    assert not by_kind(render(helm), "ServiceMonitor"), "off by default"


def test_probes_are_on_by_default_and_use_the_health_port(helm: str) -> None:
    from dispatch._controller.main import parser

    container = operator_container(render(helm))
    assert "--health-port=8081" in container["args"]
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    moved = operator_container(render(helm, "--set", "probes.port=8082"))
    assert "--health-port=8082" in moved["args"]
    assert {"name": "health", "containerPort": 8082, "protocol": "TCP"} in moved["ports"]
    assert parser().parse_args(moved["args"]).health_port == 8082
    off = operator_container(render(helm, "--set", "probes.enabled=false"))
    assert "livenessProbe" not in off
    assert "readinessProbe" not in off
    assert not [a for a in off["args"] if a.startswith("--health-port")]
    assert "health" not in {p["name"] for p in off.get("ports", [])}


# The monitoring the chart ships: the files of files/ unchanged (tests/unit/test_monitoring.py
# checks their contents against the operator's metrics; `make rules-test` runs promtool on them).
MONITORING = CHART / "files"


def test_the_chart_installs_monitoring_only_when_asked(helm: str) -> None:
    docs = render(helm)
    assert not {d["kind"] for d in docs} & {"ServiceMonitor", "PrometheusRule"}
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]


def test_the_prometheus_rule_is_the_tested_rule_file(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.release=prom",
    )
    rule = one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["namespace"] == NAMESPACE
    docs = render(helm, "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.enabled=false")
    assert by_kind(docs, "PrometheusRule") == [], "rules about metrics nobody serves"


def test_the_dashboard_config_map_holds_the_dashboard(helm: str) -> None:
    docs = render(
        helm,
        "--set",
        "metrics.grafanaDashboard.enabled=true",
        "--set",
        "metrics.grafanaDashboard.namespace=grafana",
    )
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert json.loads(cm["data"]["dispatch-operator.json"]) == dashboard
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "grafana"


def test_metrics_address_is_explicit_and_the_network_policy_admits_only_its_scrapers(helm: str) -> None:
    docs = render(helm)
    assert "--metrics-addr=0.0.0.0" in deployment_args(docs), "the binary's default is loopback"
    assert not by_kind(docs, "NetworkPolicy")
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    docs = render(
        helm,
        "--set=networkPolicy.enabled=true",
        "--set-json=networkPolicy.metricsFrom=" + json.dumps([scraper]),
    )
    policy = one(docs, "NetworkPolicy")
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["spec"]["ingress"]}
    assert rules == {"webhook": None, "health": None, "metrics": [scraper]}
    ports = {p["name"] for p in operator_container(docs)["ports"]}
    assert set(rules) <= ports, "each rule names a port the container declares"
    # No scraper named: the metrics port is closed to every peer.
    closed = one(render(helm, "--set=networkPolicy.enabled=true"), "NetworkPolicy")
    assert "metrics" not in {r["ports"][0]["port"] for r in closed["spec"]["ingress"]}


def test_slurm_ca_config_map_is_mounted_and_named_in_the_config(helm: str) -> None:
    docs = render(
        helm,
        "--set=slurm.enabled=true",
        "--set=slurm.url=https://slurmrestd.site:6820",
        "--set=slurm.caConfigMap.name=site-ca",
    )
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["slurm.yaml"])
    mounts = {m["name"]: m["mountPath"] for m in operator_container(docs)["volumeMounts"]}
    assert config["ca_file"] == f"{mounts['slurm-ca']}/ca.crt"
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["slurm-ca"]["configMap"] == {
        "name": "site-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    plain = render(helm, "--set=slurm.enabled=true", "--set=slurm.url=https://slurmrestd.site:6820")
    assert "ca_file" not in yaml.safe_load(one(plain, "ConfigMap")["data"]["slurm.yaml"])


def test_metrics_auth_kubernetes_grants_the_reviews_and_scrapes_over_https(helm: str) -> None:
    docs = render(helm, "--set=metrics.auth=kubernetes", "--set=metrics.serviceMonitor.enabled=true")
    assert "--metrics-auth=kubernetes" in deployment_args(docs)
    auth = one(docs, "ClusterRole", f"{RELEASE}-dispatch-operator-metrics-auth")
    assert _grants(auth["rules"]) == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }
    binding = one(docs, "ClusterRoleBinding", f"{RELEASE}-dispatch-operator-metrics-auth")
    sa = one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"][0]["name"] == sa
    reader = one(docs, "ClusterRole", f"{RELEASE}-dispatch-operator-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    endpoint = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"].endswith("serviceaccount/token")
    plain = render(helm)
    assert "--metrics-auth=kubernetes" not in deployment_args(plain)
    assert not [d for d in by_kind(plain, "ClusterRole") if "metrics" in d["metadata"]["name"]]


def test_cert_manager_issues_the_webhook_secret_and_injects_the_ca(helm: str) -> None:
    docs = render(helm, "--set=webhook.certManager.enabled=true")
    cert = one(docs, "Certificate")
    assert cert["spec"]["secretName"] == WEBHOOK_SECRET
    assert cert["spec"]["privateKey"]["rotationPolicy"] == "Always"
    assert cert["spec"]["issuerRef"]["name"] == one(docs, "Issuer")["metadata"]["name"]
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == WEBHOOK_SECRET]
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = one(docs, kind)
        annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert annotation == f"{NAMESPACE}/{cert['metadata']['name']}"
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    site = render(
        helm,
        "--set=webhook.certManager.enabled=true",
        "--set=webhook.certManager.issuerRef.name=site-ca",
        "--set=webhook.certManager.issuerRef.kind=ClusterIssuer",
    )
    assert not by_kind(site, "Issuer")
    assert one(site, "Certificate")["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_generated_webhook_secret_says_when_an_upgrade_renews_it(helm: str) -> None:
    secret = one(render(helm), "Secret", WEBHOOK_SECRET)
    renew_after = int(secret["metadata"]["annotations"]["dispatch.dev/renew-after"])
    assert 0 < renew_after - time.time() <= 365 * 86400 * 2 / 3 + 60
