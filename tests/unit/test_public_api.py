"""The public API as a library user meets it.

The surface is derived from ``vars(dispatch)``, so a name that leaks into the package (an import
left behind, ``annotations`` from a ``__future__`` import) fails here; every type a public
signature mentions must itself be public and documented.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib.metadata
import inspect
import subprocess
import sys
import tomllib
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

import dispatch
from dispatch import (
    Action,
    Actor,
    ActorKind,
    CauseKind,
    ConditionNotMet,
    ConfigError,
    DispatchError,
    Enforcer,
    InvalidTransition,
    JobSpec,
    MemoryBackend,
    PlanError,
    RecoveryPolicy,
    Rule,
    Shape,
    State,
    compose,
)

ROOT = Path(__file__).resolve().parents[2]
ADA = Actor(kind=ActorKind.HUMAN, id="ada")

PUBLIC = [
    "Action",
    "Actor",
    "ActorKind",
    "AdapterNotFound",
    "Affinity",
    "Authorize",
    "Backend",
    "BackendAction",
    "BackendError",
    "Backoff",
    "CancelRequest",
    "Capabilities",
    "Cause",
    "CauseCost",
    "CauseKind",
    "Change",
    "Cluster",
    "ConditionNotMet",
    "ConfigError",
    "ConfigMapSource",
    "Cost",
    "Create",
    "Decision",
    "DispatchError",
    "Done",
    "EmptyDirSource",
    "End",
    "Enforcer",
    "Env",
    "EnvFromReference",
    "EnvFromSource",
    "ExitCodeOperator",
    "ExitCodes",
    "FieldChange",
    "Intent",
    "InvalidTransition",
    "JobExists",
    "JobNotFound",
    "JobSpec",
    "KubeflowOptions",
    "LimitPlan",
    "Listener",
    "LocalObjectReference",
    "MemoryBackend",
    "MemoryChange",
    "MemoryStore",
    "NativeRule",
    "ObjectExists",
    "ObjectView",
    "Observer",
    "Operator",
    "OptionsChange",  # the base of every backend's change model (Change.options holds them)
    "OptionsModel",  # the base of every backend's options model (JobSpec.options holds them),
    "PersistentVolumeClaimSource",
    "Phase",
    "Plan",
    "PlanError",
    "PlannedRule",
    "QueuePlan",
    "Record",
    "RecordCanonical",
    "RecordEnd",
    "RecordError",
    "RecordOutcome",
    "RecordRestarts",
    "RecordSettled",
    "RecordStop",
    "RecordStore",
    "RecordSuspend",
    "RecoveryPolicy",
    "Release",
    "Resources",
    "Resume",
    "RetryRequest",
    "Rule",
    "SecretSource",
    "Shape",
    "SimulatedEnd",
    "Simulation",
    "SlurmChange",
    "SlurmOptions",
    "State",
    "Status",
    "Step",
    "StopKind",
    "StopPolicy",
    "StopRequest",
    "Submission",
    "SubmissionStatus",
    "Subscribers",
    "Supervisor",
    "SuspendRequest",
    "TimeLimitChange",
    "Toleration",
    "TransientBackendError",
    "Transition",
    "Unsubscribe",
    "VersionConflict",
    "Versioned",
    "Volume",
    "VolumeMount",
    "Wait",
    "Wake",
    "WarningSignal",
    "Write",
    "compose",
    "decide",
    "describe_step",
    "due",
    "make_plan",
    "open",
    "simulate",
    "spec_for",
    "status",
]
"""Every public name of the package, sorted: what ``vars(dispatch)`` holds without a leading ``_``."""

ALIASES = {"Step", "Write", "BackendAction", "Unsubscribe", "Wake"}
"""Type aliases: they have no ``__module__`` or docstring of their own."""


def public_objects() -> dict[str, object]:
    return {name: value for name, value in vars(dispatch).items() if not name.startswith("_")}


def test_the_surface_is_what_the_package_holds() -> None:
    """Derived from vars(dispatch): a leaked name (an import left behind) fails here."""
    assert sorted(PUBLIC) == PUBLIC
    assert sorted(public_objects()) == PUBLIC
    assert "annotations" not in vars(dispatch)
    # __all__ is the same minus open (see test_star_import_keeps_the_builtin_open) plus the version
    assert sorted(dispatch.__all__) == sorted([*(n for n in PUBLIC if n != "open"), "__version__"])


def test_the_surface_test_fails_on_a_leaked_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "annotations", object(), raising=False)
    with pytest.raises(AssertionError):
        test_the_surface_is_what_the_package_holds()


def test_public_names_report_module_dispatch() -> None:
    wrong = {
        name: getattr(value, "__module__", None)
        for name, value in public_objects().items()
        if name not in ALIASES and getattr(value, "__module__", None) != "dispatch"
    }
    assert wrong == {}


def test_every_public_name_is_documented() -> None:
    missing = [
        name
        for name, value in public_objects().items()
        if name not in ALIASES and not (inspect.getdoc(value) or "").strip()
    ]
    assert missing == []
    for name, value in public_objects().items():
        if isinstance(value, type) and name not in ALIASES:
            # its own docstring, not one inherited from a base (pydantic's, Enum's, Exception's)
            assert (vars(value).get("__doc__") or "").strip(), name


_MODULES = [
    "dispatch._model",
    "dispatch._decide",
    "dispatch._cluster",
    "dispatch._supervisor",
    "dispatch._protocols",
    "dispatch._errors",
    "dispatch._backends.memory._adapter",
    "dispatch._memstore",
    "dispatch._plan",
]


def _namespace() -> dict[str, object]:
    names: dict[str, object] = {}
    for module in _MODULES:
        names.update(vars(sys.modules[module]))
    return names


def _hints(owner: object) -> list[object]:
    """The annotations of a function, a method, a property, a pydantic model or a dataclass."""
    found: list[object] = []
    if isinstance(owner, type) and issubclass(owner, BaseModel):
        found += [f.annotation for f in owner.model_fields.values()]
        return found
    if dataclasses.is_dataclass(owner) and isinstance(owner, type):
        found += list(typing.get_type_hints(owner, globalns=_namespace()).values())
        return found
    if inspect.isfunction(owner):
        found += list(typing.get_type_hints(owner).values())
    return found


def _classes(hint: object) -> set[type]:
    """Every class a type hint mentions, through unions, generics and Annotated."""
    out: set[type] = set()
    stack = [hint]
    while stack:
        h = stack.pop()
        if isinstance(h, type) and not isinstance(h, types.GenericAlias):
            out.add(h)
        origin = typing.get_origin(h)
        if origin is not None and isinstance(origin, type):
            out.add(origin)
        stack.extend(a for a in typing.get_args(h) if not isinstance(a, str | int | float | bool))
    return out


def _members(cls: type) -> list[object]:
    members: list[object] = [vars(cls)["__init__"]] if "__init__" in vars(cls) else []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property) and value.fget is not None:
            members.append(value.fget)
        elif inspect.isfunction(value):
            members.append(value)
    return members


def test_every_type_in_a_public_signature_is_public() -> None:
    public = {id(v) for v in public_objects().values()}
    leaks: set[str] = set()
    for name, value in public_objects().items():
        owners: list[object] = [value]
        if isinstance(value, type):
            owners += _members(value)
        for owner in owners:
            for hint in _hints(owner):
                for cls in _classes(hint):
                    module = getattr(cls, "__module__", "")
                    if module.startswith("dispatch") and id(cls) not in public:
                        leaks.add(f"{name} mentions {module}.{cls.__qualname__}")
    assert leaks == set()


def test_the_signature_check_finds_a_private_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """It can fail: take a public type away and the signatures that mention it are reported."""
    monkeypatch.delattr(dispatch, "Intent")
    with pytest.raises(AssertionError, match="Intent"):
        test_every_type_in_a_public_signature_is_public()


def test_one_error_hierarchy() -> None:
    errors = [v for v in public_objects().values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert {e.__name__ for e in errors if not issubclass(e, DispatchError)} == set()
    assert issubclass(InvalidTransition, ValueError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(dispatch.AdapterNotFound, LookupError)
    assert issubclass(dispatch.JobNotFound, KeyError)


async def test_invalid_transition_is_a_dispatch_error() -> None:
    backend = MemoryBackend(Shape.SLURM)
    with pytest.raises(DispatchError):
        backend.env.run("no-such-object")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"auto_run": "false"}, False),
        ({"auto_run": "False"}, False),
        ({"auto_run": "no"}, False),
        ({"auto_run": "0"}, False),
        ({"auto_run": "true"}, True),
        ({"auto_run": "YES"}, True),
        ({"auto_run": True}, True),
        ({"auto_run": 0}, False),
        ({}, False),
    ],
)
async def test_memory_config_from_text_parses_booleans_strictly(
    config: dict[str, object], expected: bool
) -> None:
    cluster = await dispatch.open("memory", config)
    assert isinstance(cluster.backend, MemoryBackend)
    assert cluster.backend.auto_run is expected


@pytest.mark.parametrize("value", ["maybe", "", "2", 2, 1.5, None, ["true"]])
async def test_a_boolean_that_is_none_names_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match="auto_run") as caught:
        await dispatch.open("memory", {"auto_run": value})
    assert caught.value.key == "auto_run"
    assert isinstance(caught.value, ValueError)


async def test_memory_shape_from_text() -> None:
    cluster = await dispatch.open("memory", {"shape": "Kubeflow", "auto_run": "on"})
    assert isinstance(cluster.backend, MemoryBackend)
    assert (cluster.backend.shape, cluster.backend.auto_run) == (Shape.KUBEFLOW, True)
    with pytest.raises(ConfigError, match="shape"):
        await dispatch.open("memory", {"shape": "pbs"})
    with pytest.raises(ConfigError, match="nodes") as caught:
        await dispatch.open("memory", {"nodes": 3})
    assert caught.value.key == "nodes"


async def test_adapter_config_errors_are_config_errors() -> None:
    """The real adapters' config mistakes, through open(), are ConfigErrors naming the key."""
    with pytest.raises(ConfigError, match="bogus"):
        await dispatch.open("slurm", {"url": "http://127.0.0.1:1", "bogus": 1})
    with pytest.raises(ConfigError, match="url"):
        await dispatch.open("slurm", {"url": 5})
    with pytest.raises(ConfigError, match="bogus"):
        await dispatch.open("kubeflow", {"bogus": 1})


def test_star_import_keeps_the_builtin_open() -> None:
    namespace: dict[str, object] = {}
    exec("from dispatch import *", namespace)
    assert "open" not in namespace
    assert "Operator" in namespace
    exec("x = open", namespace)
    assert namespace["x"] is open


async def test_dispatch_open_is_the_seeds_open() -> None:
    assert inspect.iscoroutinefunction(dispatch.open)
    cluster = await dispatch.open("memory", {"auto_run": "true"})
    assert isinstance(cluster, dispatch.Cluster)


def test_the_version_has_one_source() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dispatch._version.__version__"}
    assert dispatch.__version__ == importlib.metadata.version("dispatch-jobs")
    done = subprocess.run(
        [sys.executable, "-m", "dispatch._controller", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.split() == ["dispatch-operator", dispatch.__version__]


def seed_spec(name: str = "finetune", *rules: Rule) -> JobSpec:
    return JobSpec(
        name=name,
        command=("torchrun", "train.py"),
        recovery=RecoveryPolicy(rules=rules or (Rule(on=(CauseKind.PREEMPTED,), budget=2),)),
    )


async def test_operator_plan_is_a_dry_run() -> None:
    cluster = compose(MemoryBackend(Shape.SLURM))
    plan = cluster.operator.plan(seed_spec(), supervised=True)
    assert plan.job == "finetune"
    assert plan.rules[0].enforcer is Enforcer.SUPERVISOR
    assert cluster.store.jobs() == []  # type: ignore[attr-defined]
    assert await cluster.backend.list("finetune") == []
    with pytest.raises(PlanError):
        cluster.operator.plan(seed_spec())
    assert plan == await cluster.operator.submit(seed_spec(), ADA, supervised=True)


async def test_observer_wait_is_the_tutorials_wait_for() -> None:
    backend = MemoryBackend(Shape.SLURM, auto_run=True)
    cluster = compose(backend)
    plan = await cluster.operator.submit(seed_spec(), ADA, supervised=True)
    done = asyncio.create_task(cluster.supervisor(poll_interval=0.05).run(plan.job))
    async with asyncio.timeout(10):
        st = await cluster.observer.wait(plan.job, until=lambda s: s.state is State.RUNNING)
        assert st.submissions[0].canonical is not None
        backend.env.complete(st.submissions[0].canonical)
        final = await cluster.observer.wait(plan.job)
        await done
    assert final.settled
    assert final.state is State.SUCCEEDED
    with pytest.raises(ConditionNotMet) as caught:
        await cluster.observer.wait(plan.job, until=lambda s: s.state is State.FAILED)
    assert caught.value.status == final


async def test_observer_wait_bounded_by_asyncio_timeout() -> None:
    cluster = compose(MemoryBackend(Shape.SLURM))
    plan = await cluster.operator.submit(seed_spec(), ADA, supervised=True)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await cluster.observer.wait(
                plan.job, until=lambda s: s.state is State.RUNNING, poll_interval=0.05
            )


def test_restart_rules_are_a_public_action() -> None:
    assert Action.RESTART in Action
    assert issubclass(State, enum.Enum)
