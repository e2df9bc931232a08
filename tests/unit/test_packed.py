"""What the caches keep of each object: its projection packed, the JSON
text deflated against the first text of its kind. Every recorded PyTorchJob and pod state (from the
lab, tests/unit/data/kubeflow/) reads back exactly as projected, in a small part of its text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch._backends.kubeflow._adapter import PYTORCHJOB
from dispatch._kubeclient import Packed, Packer, resource_version
from dispatch._kubeclient._informer import SAMPLE_MAX
from dispatch._workload import project_object, project_pod
from dispatch._workload._kept import object_shape
from tests.support.recorded import states

DATA = Path(__file__).parent / "data" / "kubeflow"


def text(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize("resource", ["pytorchjobs", "pods"])
def test_every_recorded_state_reads_back_as_projected_in_a_fraction_of_its_text(resource: str) -> None:
    shape = object_shape(PYTORCHJOB)
    bodies = states(DATA, resource)
    projections = [project_object(shape, b) if resource == "pytorchjobs" else project_pod(b) for b in bodies]
    assert len(projections) > 20
    pack = Packer()
    packed = [pack(p) for p in projections]
    assert pack.sample == text(projections[0])  # the first text packed is the sample of all
    for projection, kept in zip(projections, packed, strict=True):
        assert kept.sample is pack.sample
        assert kept.body() == projection
        assert kept.version == resource_version(projection)
    kept_bytes = sum(len(p.data) for p in packed)
    text_bytes = sum(len(text(p)) for p in projections)
    assert kept_bytes * 2 < text_bytes, (kept_bytes, text_bytes)


def test_a_packed_body_without_a_sample_reads_back_and_each_reader_gets_its_own_copy() -> None:
    body = {"metadata": {"name": "a", "resourceVersion": "7"}, "status": {"phase": "Running"}}
    packed = Packed(body)
    first = packed.body()
    assert first == body
    assert packed.version == 7
    first["status"]["phase"] = "Failed"  # a reader's change is its own
    assert packed.body() == body


def test_a_long_first_text_gives_a_sample_of_its_end_and_everything_reads_back() -> None:
    pack = Packer()
    long = {"metadata": {"name": "a"}, "status": {"message": "x" * (2 * SAMPLE_MAX)}}
    first, second = pack(long), pack({"metadata": {"name": "b"}})
    assert len(pack.sample) == SAMPLE_MAX
    assert pack.sample == text(long)[-SAMPLE_MAX:]
    assert (first.body(), second.body()) == (long, {"metadata": {"name": "b"}})
