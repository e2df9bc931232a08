"""Every backend's options are ``JobSpec.options[name]``, given alike for every backend: on the wire
as ``spec.<name>`` (the codec builds the model), in Python as a keyword named after the backend."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import dispatch
from dispatch import _dispatchjob, _registry
from dispatch._model import Capabilities, JobSpec, OptionsModel
from dispatch._registry import BackendInfo, Where

WITH_OPTIONS = sorted(_registry.option_fields())
SAMPLE: dict[str, Any] = {"image": "trainer:1", "runtime": "torch-distributed"}
"""Enough for every built-in options model: each takes the fields of these it has."""


def sample(name: str) -> OptionsModel:
    model = _registry.option_fields()[name].options
    assert model is not None
    built: OptionsModel = model.model_validate({k: v for k, v in SAMPLE.items() if k in model.model_fields})
    return built


def test_every_backend_a_dispatchjob_may_name_has_an_options_model() -> None:
    assert {b.name for b in _registry.spec_backends()} == set(WITH_OPTIONS)


@pytest.mark.parametrize("name", WITH_OPTIONS)
def test_a_backend_s_options_are_a_keyword_named_after_it(name: str) -> None:
    options = sample(name)
    spec = JobSpec(name="a", command=("x",), **{name: options})
    assert spec.options == {name: options}
    assert spec == JobSpec(name="a", command=("x",), options={name: options})
    assert _registry.option_fields()[name].options_of(spec) is options
    others = [b for b in _registry.option_fields().values() if b.name != name]
    assert [b.options_of(spec) for b in others] == [None] * len(others)


@pytest.mark.parametrize("name", WITH_OPTIONS)
def test_the_wire_and_the_keyword_give_the_same_spec(name: str) -> None:
    options = sample(name)
    wire = options.model_dump(mode="json", by_alias=True, exclude_none=True)
    body = {
        "metadata": {"name": "a", "namespace": "team-a"},
        "spec": {"backend": name, "command": ["x"], name: wire},
    }
    spec = _dispatchjob.job_spec(body)
    assert spec == JobSpec(name="a", command=("x",), **{name: options})
    assert _dispatchjob.spec_options(spec) == {name: wire}


def test_the_public_options_models_are_their_backends() -> None:
    assert _registry.option_fields()["kubeflow"].options is dispatch.KubeflowOptions
    assert _registry.option_fields()["slurm"].options is dispatch.SlurmOptions


def test_options_given_twice_are_refused() -> None:
    options = dispatch.KubeflowOptions(image="trainer:1")
    with pytest.raises(ValidationError, match="options of kubeflow given twice"):
        JobSpec(name="a", command=("x",), kubeflow=options, options={"kubeflow": options})


def test_a_mapping_under_a_backend_s_name_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"kubeflow\n  Extra inputs are not permitted"):
        JobSpec.model_validate({"name": "a", "command": ["x"], "kubeflow": {"image": "trainer:1"}})


def test_another_backend_s_model_under_a_name_is_refused_when_read() -> None:
    spec = JobSpec(name="a", command=("x",), jobset=dispatch.KubeflowOptions(image="trainer:1"))
    with pytest.raises(TypeError, match="'jobset' are a KubeflowOptions, not JobSetOptions"):
        _registry.option_fields()["jobset"].options_of(spec)


def test_a_backend_cannot_be_named_like_a_field_of_the_spec() -> None:
    with pytest.raises(ValueError, match=r"spec\.queue is a field of JobSpec"):
        BackendInfo(name="queue", summary="x", where=Where.EXTERNAL, capabilities=Capabilities(), open="m:f")
