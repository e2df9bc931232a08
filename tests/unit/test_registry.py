"""The backend registry is the one source of the backend list.

Two halves: every backend registered today is in every generated list (the CRD's enum, options
fields and CEL rules, the chart's RBAC template and values schema, the metrics' resources, the
docs' table, the operator's ``--backend``), and a backend registered through the entry points
with nothing else edited is picked up by each of them (a test-only declaration, ``FAKE``, added
to the ``dispatch.adapters`` entry points for the test).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Annotated, Any

import pytest
import yaml
from pydantic import Field

import dispatch
from dispatch import _dispatchjob, _registry
from dispatch._cli import _manifest
from dispatch._controller import crd, main, metrics, webhook
from dispatch._model import Action, Capabilities, CauseKind, JobSpec, NativeRule, OptionsModel
from dispatch._registry import BackendInfo, PolicyRule, Where
from tests.support.builders import dispatch_job

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))
gen_chart = importlib.import_module("gen_chart")
gen = importlib.import_module("gen")

HEAVY = ("kopf", "aiohttp", "httpx", "kubernetes_asyncio", "prometheus_client")


class FakeOptions(OptionsModel):
    """A test backend's options."""

    image: Annotated[str, Field(min_length=1, max_length=512)]
    parallelism: Annotated[int, Field(ge=1, le=8)] = 1
    """How many pods at once."""


FAKE_RULE = NativeRule(
    causes=frozenset({CauseKind.NON_ZERO_EXIT}), action=Action.RESTART, note="restarts in place"
)
FAKE: BackendInfo[FakeOptions] = BackendInfo(
    name="fakeflow",
    summary="FakeFlows of a test-only declaration",
    where=Where.KUBERNETES,
    capabilities=Capabilities(native=(FAKE_RULE,)),
    open=f"{__name__}:open_fake",
    open_in_operator=f"{__name__}:open_fake_in_operator",
    options=FakeOptions,
    options_required=True,
    options_hint="the image, at least",
    rbac=(
        PolicyRule(
            ("fake.example.com",), ("fakeflows",), ("create", "get", "delete"), why="One per submission."
        ),
    ),
    metric_resources=("fakeflows",),
)
OPENED: list[tuple[object, Sequence[str] | None]] = []


def open_fake(config: Mapping[str, object] | None) -> dispatch.MemoryBackend:
    return dispatch.MemoryBackend(dispatch.Shape.KUBEFLOW)


def open_fake_in_operator(api: object, *, namespaces: Sequence[str] | None) -> dispatch.MemoryBackend:
    OPENED.append((api, namespaces))
    return dispatch.MemoryBackend(dispatch.Shape.KUBEFLOW)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[BackendInfo[FakeOptions]]:
    """FAKE registered as if a package's pyproject named it in ``dispatch.adapters``."""
    real = importlib.metadata.entry_points

    def entry_points(*, group: str) -> list[EntryPoint]:
        return [*real(group=group), EntryPoint(FAKE.name, f"{__name__}:FAKE", group)]

    monkeypatch.setattr("dispatch._registry.entry_points", entry_points)
    _registry.registered.cache_clear()
    yield FAKE
    _registry.registered.cache_clear()


def body(backend: str, **spec: Any) -> dict[str, Any]:
    return dispatch_job(backend=backend, namespace="team-a", **spec)


# ---- the registry itself -------------------------------------------------------------------------


def test_the_built_in_backends_are_registered_through_the_entry_points() -> None:
    registered = _registry.registered()
    assert {"kubeflow", "memory", "slurm"} <= set(registered)
    assert list(registered) == sorted(registered)
    assert registered["kubeflow"].where is Where.KUBERNETES
    assert registered["slurm"].where is Where.EXTERNAL
    assert "memory" not in [b.name for b in _registry.spec_backends()]  # never a spec.backend
    assert dispatch.KubeflowOptions is _registry.registered()["kubeflow"].options


def test_registering_loads_no_client() -> None:
    """Every declaration (and the API codec) imports pydantic and the core only: checked in a fresh
    interpreter, since this one has loaded the operator already."""
    code = (
        "import sys\n"
        "from dispatch import _dispatchjob, _registry\n"
        "_registry.registered()\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_an_entry_point_under_another_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "dispatch._registry.entry_points", lambda *, group: [EntryPoint("other", f"{__name__}:FAKE", group)]
    )
    _registry.registered.cache_clear()
    try:
        with pytest.raises(ValueError, match="declares a backend named 'fakeflow'"):
            _registry.registered()
    finally:
        _registry.registered.cache_clear()


def test_an_entry_point_that_does_not_load_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "dispatch._registry.entry_points",
        lambda *, group: [EntryPoint("gone", "dispatch._no_such:BACKEND", group)],
    )
    _registry.registered.cache_clear()
    try:
        with pytest.raises(
            ImportError, match=r"entry point dispatch\.adapters:gone = dispatch\._no_such:BACKEND"
        ):
            _registry.registered()
    finally:
        _registry.registered.cache_clear()


def test_a_declaration_must_say_how_the_operator_opens_a_kubernetes_backend() -> None:
    with pytest.raises(ValueError, match="needs open_in_operator"):
        BackendInfo(name="x", summary="x", where=Where.KUBERNETES, capabilities=Capabilities(), open="m:f")
    with pytest.raises(ValueError, match="options_required without an options model"):
        BackendInfo(
            name="x",
            summary="x",
            where=Where.EXTERNAL,
            capabilities=Capabilities(),
            open="m:f",
            options_required=True,
        )


def test_the_core_refuses_options_it_cannot_type() -> None:
    with pytest.raises(ValueError, match=r"options\['fakeflow'\] must be an instance"):
        JobSpec(name="a", command=("x",), options={"fakeflow": {"image": "i"}})


# ---- every registered backend is in every generated list -----------------------------------------


def _crd_spec() -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "crds" / "dispatch.dev_dispatchjobs.yaml").read_text())
    spec: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def test_every_registered_backend_is_in_every_generated_list() -> None:
    spec = _crd_spec()
    assert spec["properties"]["backend"]["enum"] == [b.name for b in _registry.spec_backends()]
    rules = [v["rule"] for v in spec["x-kubernetes-validations"]]
    for info in _registry.spec_backends():
        assert f"`{info.name}`" in spec["properties"]["backend"]["description"]
        if info.options is not None:
            assert info.name in spec["properties"], info.name
        if info.options_required:
            assert f"self.backend != '{info.name}' || has(self.{info.name})" in rules
    schema = json.loads((REPO / gen_chart.VALUES_SCHEMA).read_text())
    kube = [b.name for b in _registry.kubernetes_backends()]
    assert schema["properties"]["backends"]["items"]["enum"] == kube
    rbac = (REPO / gen_chart.BACKENDS_TEMPLATE).read_text()
    docs = (REPO / "docs" / "backends.md").read_text()
    for info in _registry.registered().values():
        assert f"| `{info.name}` |" in docs, info.name
        assert set(info.metric_resources) <= metrics.RESOURCES, info.name
    for info in _registry.kubernetes_backends():
        assert main.enabled_backends(argparse.Namespace(backend=[info.name])) == [info.name]
        for rule in info.rbac:
            assert f"  resources: {json.dumps(list(rule.resources))}" in rbac, (info.name, rule)
            assert f'(has "{info.name}" $enabled)' in rbac


def test_the_generated_files_are_fresh() -> None:
    assert gen.check() == 0


# ---- a new backend is picked up with no other edit -----------------------------------------------


def test_a_new_backend_enters_the_crd(fake: BackendInfo[FakeOptions]) -> None:
    schema = crd.spec_schema()
    assert schema["properties"]["backend"]["enum"] == [b.name for b in _registry.spec_backends()]
    assert "fakeflow" in schema["properties"]["backend"]["enum"]
    options = schema["properties"]["fakeflow"]
    assert options["required"] == ["image"]
    assert options["properties"]["parallelism"]["description"] == "How many pods at once."
    assert {
        "rule": "self.backend != 'fakeflow' || has(self.fakeflow)",
        "message": "fakeflow (the image, at least) is required when backend is fakeflow",
        "fieldPath": ".fakeflow",
    } in schema["x-kubernetes-validations"]
    immutable = [v for v in schema["x-kubernetes-validations"] if v.get("fieldPath") == ".fakeflow"]
    assert any("oldSelf.fakeflow" in v["rule"] for v in immutable)


def test_a_new_backend_is_decoded_by_the_api(fake: BackendInfo[FakeOptions]) -> None:
    spec = _dispatchjob.job_spec(body("fakeflow", fakeflow={"image": "trainer:1", "parallelism": 2}))
    assert fake.options_of(spec) == FakeOptions(image="trainer:1", parallelism=2)
    assert _dispatchjob.spec_options(spec) == {"fakeflow": {"image": "trainer:1", "parallelism": 2}}
    with pytest.raises(
        _dispatchjob.SpecError,
        match=r"^spec\.fakeflow\.parallelism: Input should be less than or equal to 8$",
    ):
        _dispatchjob.job_spec(body("fakeflow", fakeflow={"image": "trainer:1", "parallelism": 9}))
    with pytest.raises(_dispatchjob.SpecError, match=r"^spec\.options: Extra inputs are not permitted"):
        _dispatchjob.job_spec(body("fakeflow", fakeflow={"image": "i"}, options={"fakeflow": {"image": "i"}}))
    with pytest.raises(_dispatchjob.SpecError, match=r"spec\.fakeflow \(the image, at least\) is required"):
        _dispatchjob.job_spec(body("fakeflow"))
    with pytest.raises(_dispatchjob.SpecError, match=r"spec\.fakeflow is set but spec\.backend is kubeflow"):
        _dispatchjob.job_spec(body("kubeflow", kubeflow={"image": "i"}, fakeflow={"image": "i"}))


def test_a_new_backend_is_admitted_and_planned_with_its_capabilities(fake: BackendInfo[FakeOptions]) -> None:
    restart = {"on": ["non-zero-exit"], "action": "restart", "budget": 2}
    webhook.check(body("fakeflow", fakeflow={"image": "i"}, recovery={"rules": [restart]}), None, "CREATE")
    with pytest.raises(webhook.Refused, match=r"spec\.fakeflow\.image"):
        webhook.check(body("fakeflow", fakeflow={"image": ""}), None, "CREATE")
    manifest = _manifest.from_object(body("fakeflow", fakeflow={"image": "i"}, recovery={"rules": [restart]}))
    [rule] = manifest.plan().rules
    assert rule.enforcer is dispatch.Enforcer.SCHEDULER
    with pytest.raises(_manifest.ManifestError, match=r"one of \['fakeflow', .*\], not 'nope'"):
        _manifest.from_object(body("nope"))


def test_a_new_backend_is_opened_by_the_operator_and_the_library(fake: BackendInfo[FakeOptions]) -> None:
    import asyncio

    args = main.parser().parse_args(["--backend", "fakeflow", "--backend", "kubeflow"])
    assert main.enabled_backends(args) == ["fakeflow", "kubeflow"]
    args = main.parser().parse_args(["--backend", "fakeflow"])
    api = object()
    OPENED.clear()
    backends = asyncio.run(main.open_backends(api, args, ["team-a"]))
    assert list(backends) == ["fakeflow"]
    assert [(api, ["team-a"])] == OPENED
    cluster = asyncio.run(dispatch.open("fakeflow"))
    assert cluster.operator.plan(JobSpec(name="a", command=("x",))).rules == ()
    with pytest.raises(main.ArgumentError, match="not a registered Kubernetes backend"):
        main.enabled_backends(main.parser().parse_args(["--backend", "slurm"]))
    assert main.enabled_backends(main.parser().parse_args(["--backend", "none"])) == []
    assert main.enabled_backends(main.parser().parse_args([])) == ["kubeflow"]


def test_a_new_backend_gets_exactly_its_rbac_rules_in_the_chart(fake: BackendInfo[FakeOptions]) -> None:
    rbac = gen_chart.render_backend_rules()
    assert '(list "fakeflow" ' in rbac  # first of the sorted Kubernetes backends
    rule = (
        '{{- if (has "fakeflow" $enabled) }}\n'
        "# fakeflow: One per submission.\n"
        '- apiGroups: ["fake.example.com"]'
    )
    assert rule in rbac
    schema = json.loads(gen_chart.render_values_schema())
    enum = schema["properties"]["backends"]["items"]["enum"]
    assert enum[0] == "fakeflow"
    assert "kubeflow" in enum


def test_the_docs_table_lists_a_new_backend(fake: BackendInfo[FakeOptions]) -> None:
    table = gen.render_backends_docs()
    assert "| `fakeflow` | kubernetes | FakeFlows of a test-only declaration |" in table


def test_the_memory_backend_imitates_a_new_backend_with_its_declared_capabilities(
    fake: BackendInfo[FakeOptions],
) -> None:
    memory = dispatch.MemoryBackend("fakeflow")
    assert memory.capabilities is FAKE.capabilities
    assert memory.shape is dispatch.Shape.KUBEFLOW  # a Kubernetes object's name, chosen by its creator
    assert memory.name == "memory-fakeflow"
    with pytest.raises(ValueError, match=r"shape must be one of slurm, kubeflow, .*fakeflow.*, not 'lsf'"):
        dispatch.MemoryBackend("lsf")
