"""DispatchJob manifests -> the core's JobSpec and plan, without a cluster.

The DispatchJob spec is the core's :class:`~dispatch.JobSpec` without ``name`` (it is
``metadata.name``) plus ``backend`` and ``cancel``. The plan is computed as the operator computes it:
with the capabilities of the manifest's backend, and ``supervised=True`` (the operator runs a
supervisor for every DispatchJob).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import _dispatchjob as dispatchjob
from .._constants import API_VERSION, KIND
from .._model import Capabilities, JobSpec, Plan
from .._plan import make_plan


class ManifestError(ValueError):
    """The manifest is not a valid DispatchJob."""


def capabilities_for(backend: str) -> Capabilities:
    """What ``backend``'s scheduler enforces natively, with its default configuration.

    Read from the backend's registry entry, the one source its adapter declares too, so the
    plugin's plan is the operator's.
    """
    try:
        return dispatchjob.backend_of({"backend": backend}).capabilities
    except dispatchjob.SpecError as error:
        raise ManifestError(str(error)) from None


@dataclass(frozen=True, slots=True)
class Manifest:
    namespace: str
    name: str
    backend: str
    spec: JobSpec

    @property
    def job(self) -> str:
        return f"{self.namespace}/{self.name}"

    def plan(self, capabilities: Capabilities | None = None) -> Plan:
        """The plan the operator would make (raises PlanError when a rule would go unenforced)."""
        caps = capabilities if capabilities is not None else capabilities_for(self.backend)
        return make_plan(self.job, self.spec, caps, supervised=True)


def from_object(obj: Mapping[str, Any], *, namespace: str | None = None) -> Manifest:
    """A DispatchJob object (a dict) -> :class:`Manifest`; raises :class:`ManifestError`."""
    if obj.get("kind") != KIND:
        raise ManifestError(f"kind is {obj.get('kind')!r}, not {KIND}")
    if obj.get("apiVersion") not in (None, API_VERSION):
        raise ManifestError(f"apiVersion is {obj.get('apiVersion')!r}, not {API_VERSION}")
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError("metadata.name is required")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ManifestError("spec is required")
    bool_key = _bool_key(spec, "spec")
    if bool_key is not None:
        raise ManifestError(
            f"{bool_key}: a key was read as a boolean (YAML 1.1 reads an unquoted on/off/yes/no as one, and "
            'so does kubectl): quote it, e.g. "on": [preempted]'
        )
    try:
        backend = dispatchjob.backend_of(spec).name
        job_spec = dispatchjob.job_spec(
            {"metadata": {"name": name, "labels": meta.get("labels")}, "spec": spec}
        )
    except dispatchjob.SpecError as error:
        raise ManifestError(str(error)) from None
    ns = meta.get("namespace") or namespace or "default"
    return Manifest(namespace=str(ns), name=name, backend=backend, spec=job_spec)


def _bool_key(node: object, path: str) -> str | None:
    """The path of the first key that YAML read as a boolean, or None."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            if isinstance(key, bool):
                return f"{path}.{str(key).lower()}"
            found = _bool_key(value, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = _bool_key(value, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def load(path: str, *, namespace: str | None = None) -> list[Manifest]:
    """Every DispatchJob in the YAML file at ``path`` (``-`` is stdin); other kinds are skipped."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except IsADirectoryError:
        raise ManifestError(f"{path} is a directory, not a manifest file") from None
    except OSError as error:
        raise ManifestError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path} is not a text file (UTF-8)") from None
    return list(parse(text, namespace=namespace, source="stdin" if path == "-" else path))


def parse(text: str, *, namespace: str | None = None, source: str = "the manifest") -> Iterator[Manifest]:
    """Every DispatchJob in ``text``; a YAML error names ``source`` (the file) where it is."""
    stream = io.StringIO(text)
    stream.name = source  # PyYAML names the stream's name in its marks (else "<unicode string>")
    try:
        docs = [d for d in yaml.safe_load_all(stream) if d is not None]
    except yaml.YAMLError as error:
        raise ManifestError(f"not YAML: {error}") from None
    found = False
    for doc in docs:
        items = doc.get("items", []) if isinstance(doc, Mapping) and doc.get("kind") == "List" else [doc]
        for item in items:
            if isinstance(item, Mapping) and item.get("kind") == KIND:
                found = True
                yield from_object(item, namespace=namespace)
    if not found:
        raise ManifestError(f"no {KIND} in the manifest")
