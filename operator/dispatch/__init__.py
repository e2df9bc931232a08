"""dispatch: submit training jobs to real schedulers and recover them exactly as their rules say.

The public API is what this module exports; every other module is private. See README.md and
docs/api.md (the library reference, generated from these docstrings).

``dispatch.open`` is here as an attribute but not in ``__all__``, so ``from dispatch import *``
does not shadow the builtin ``open``.
"""

from ._backends.kubeflow import KubeflowOptions
from ._backends.memory import Env, MemoryBackend, Shape
from ._backends.slurm import SlurmOptions
from ._cluster import Cluster, Observer, Operator, compose
from ._cluster import open as open  # public, but not in __all__: see the docstring
from ._decide import (
    Authorize,
    BackendAction,
    Create,
    Decision,
    Done,
    End,
    RecordCanonical,
    RecordEnd,
    RecordOutcome,
    RecordRestarts,
    RecordSettled,
    Release,
    Step,
    Wait,
    Write,
    decide,
    describe_step,
    due,
    status,
)
from ._errors import (
    AdapterNotFound,
    BackendError,
    ConditionNotMet,
    ConfigError,
    DispatchError,
    InvalidTransition,
    JobExists,
    JobNotFound,
    ObjectExists,
    PlanError,
    RecordError,
    TransientBackendError,
    VersionConflict,
)
from ._memstore import MemoryStore
from ._model import (
    Action,
    Actor,
    ActorKind,
    Backoff,
    CancelRequest,
    Capabilities,
    Cause,
    CauseKind,
    Enforcer,
    JobSpec,
    NativeRule,
    ObjectView,
    OptionsModel,
    Phase,
    Plan,
    PlannedRule,
    QueuePlan,
    Record,
    RecoveryPolicy,
    Resources,
    Rule,
    State,
    Status,
    Submission,
    SubmissionStatus,
    Transition,
)
from ._plan import make_plan
from ._protocols import Backend, RecordStore, Subscribers, Unsubscribe, Versioned, Wake
from ._supervisor import Intent, Listener, Supervisor
from ._version import __version__

__all__ = [
    "Action",
    "Actor",
    "ActorKind",
    "AdapterNotFound",
    "Authorize",
    "Backend",
    "BackendAction",
    "BackendError",
    "Backoff",
    "CancelRequest",
    "Capabilities",
    "Cause",
    "CauseKind",
    "Cluster",
    "ConditionNotMet",
    "ConfigError",
    "Create",
    "Decision",
    "DispatchError",
    "Done",
    "End",
    "Enforcer",
    "Env",
    "Intent",
    "InvalidTransition",
    "JobExists",
    "JobNotFound",
    "JobSpec",
    "KubeflowOptions",
    "Listener",
    "MemoryBackend",
    "MemoryStore",
    "NativeRule",
    "ObjectExists",
    "ObjectView",
    "Observer",
    "Operator",
    "OptionsModel",
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
    "RecordStore",
    "RecoveryPolicy",
    "Release",
    "Resources",
    "Rule",
    "Shape",
    "SlurmOptions",
    "State",
    "Status",
    "Step",
    "Submission",
    "SubmissionStatus",
    "Subscribers",
    "Supervisor",
    "TransientBackendError",
    "Transition",
    "Unsubscribe",
    "VersionConflict",
    "Versioned",
    "Wait",
    "Wake",
    "Write",
    "__version__",
    "compose",
    "decide",
    "describe_step",
    "due",
    "make_plan",
    "status",
]

# Public names say they are dispatch's, not a private module's (in reprs, help() and the docs).
for _name in (*__all__, "open"):
    _obj = globals()[_name]
    if isinstance(_obj, type) or (callable(_obj) and hasattr(_obj, "__code__")):
        _obj.__module__ = __name__
del _name, _obj
