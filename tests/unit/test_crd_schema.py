"""The generated DispatchJob CRD holds only what a Kubernetes structural schema accepts.

The real kube-apiserver refuses a CRD whose schema has ``patternProperties`` (pydantic writes it for
a dict whose keys carry a pattern); a CRD the API server refuses breaks every install, so the
generator's output is checked here without a server, and the key pattern must survive as CEL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CRD = Path(__file__).parents[2] / "crds" / "dispatch.dev_dispatchjobs.yaml"
# Keys of JSON Schema that apiextensions.k8s.io/v1 does not allow in a structural schema.
NOT_STRUCTURAL = frozenset(
    {"patternProperties", "$ref", "$defs", "definitions", "anyOf", "oneOf", "propertyNames"}
)


def _nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _nodes(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _nodes(value, f"{path}[{i}]")


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_the_crd_schema_has_no_key_a_structural_schema_refuses() -> None:
    bad = [f"{path}.{key}" for path, node in _nodes(_schema()) for key in node if key in NOT_STRUCTURAL]
    assert bad == []


def test_env_name_patterns_survive_as_cel_rules() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    for env in (spec["kubeflow"]["properties"]["env"], spec["slurm"]["properties"]["environment"]):
        assert env["additionalProperties"]["type"] == "string"
        rules = [v["rule"] for v in env["x-kubernetes-validations"]]
        assert any("k.matches(" in rule for rule in rules), rules
