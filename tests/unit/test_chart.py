"""The Helm chart: values schema, `helm template` output, RBAC, Pod security, the generated CRD copy.

The rendering tests need the helm binary (``make bins`` builds it; ``DISPATCH_HELM`` overrides).
Without it they skip, unless ``DISPATCH_REQUIRE_HELM=1`` (set by ``make chart-template``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dispatch import _constants as k8s_names
from dispatch._slurm import SlurmConfig

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


@cache
def helm_binary() -> str | None:
    """helm from DISPATCH_HELM, then the build cache (hack/build-bins.sh), then PATH."""
    env = os.environ.get("DISPATCH_HELM")
    if env and os.access(env, os.X_OK):
        return env
    script = REPO / "hack" / "build-bins.sh"
    if script.exists():
        out = subprocess.run(
            ["bash", str(script), "--print-env"], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            key, _, value = line.partition("=")
            if key == "DISPATCH_HELM" and os.access(value, os.X_OK):
                return value
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    found = helm_binary()
    if found is None:
        if os.environ.get("DISPATCH_REQUIRE_HELM") == "1":
            pytest.fail("helm not found (run `make bins` or set DISPATCH_HELM)", pytrace=False)
        pytest.skip("helm not found (run `make bins` or set DISPATCH_HELM)")
    return found


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
        if d["metadata"]["name"] in {f"{RELEASE}-dispatch-operator", f"{RELEASE}-dispatch-operator-kopf"}
    ]
    assert _grants(_rules(operator_roles)) == {
        *(("dispatch.dev", "dispatchjobs", v) for v in ("get", "list", "watch", "patch")),
        *(("dispatch.dev", "dispatchjobs/status", v) for v in ("get", "update", "patch")),
        ("dispatch.dev", "dispatchjobs/finalizers", "update"),
        *(("kubeflow.org", "pytorchjobs", v) for v in ("create", "get", "list", "watch", "patch", "delete")),
        *(("", "pods", v) for v in ("get", "list", "watch", "delete", "deletecollection")),
        *((g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")),
        *(("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")),
    }
    grants = _grants(_rules(docs))
    assert not [g for g in grants if g[1] == "secrets"], "the operator never reads Secrets"
    binding = one(docs, "ClusterRoleBinding", f"{RELEASE}-dispatch-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-dispatch-operator", "namespace": NAMESPACE}
    ]


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
    assert {g[1] for g in _grants(cluster_rules)} == {"customresourcedefinitions", "namespaces"}
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
    assert [s["metadata"]["name"] for s in by_kind(off, "Service")] == [f"{RELEASE}-dispatch-operator-webhook"]
    assert "metrics" not in {p["name"] for p in operator_container(off).get("ports", [])}
    assert not [a for a in deployment_args(off) if a.startswith("--metrics-port")]


def test_selector_matches_the_pod_labels(helm: str) -> None:
    deployment = one(render(helm, "--set", "podLabels.team=ml"), "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert labels["team"] == "ml"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"{RELEASE}-dispatch-operator"
