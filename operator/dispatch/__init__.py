"""dispatch: submit training jobs to real schedulers and recover them exactly as their rules say.

The public API is what this module exports; every other module is private. See README.md.
"""

from __future__ import annotations

from ._cluster import Cluster, Observer, Operator, compose, open
from ._decide import Decision, decide, status
from ._errors import (
    AdapterNotFound,
    BackendError,
    DispatchError,
    JobExists,
    JobNotFound,
    ObjectExists,
    PlanError,
    RecordError,
    TransientBackendError,
    VersionConflict,
)
from ._memory import Env, InvalidTransition, MemoryBackend, Shape
from ._memstore import MemoryStore
from ._model import (
    Action,
    Actor,
    ActorKind,
    Capabilities,
    Cause,
    CauseKind,
    Enforcer,
    JobSpec,
    KubeflowOptions,
    NativeRule,
    ObjectView,
    Phase,
    Plan,
    PlannedRule,
    Record,
    RecoveryPolicy,
    Resources,
    Rule,
    SlurmOptions,
    State,
    Status,
    Submission,
    SubmissionStatus,
    Transition,
)
from ._plan import make_plan
from ._protocols import Backend, RecordStore, Versioned
from ._supervisor import Supervisor

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Actor",
    "ActorKind",
    "AdapterNotFound",
    "Backend",
    "BackendError",
    "Capabilities",
    "Cause",
    "CauseKind",
    "Cluster",
    "Decision",
    "DispatchError",
    "Enforcer",
    "Env",
    "InvalidTransition",
    "JobExists",
    "JobNotFound",
    "JobSpec",
    "KubeflowOptions",
    "MemoryBackend",
    "MemoryStore",
    "NativeRule",
    "ObjectExists",
    "ObjectView",
    "Observer",
    "Operator",
    "Phase",
    "Plan",
    "PlanError",
    "PlannedRule",
    "Record",
    "RecordError",
    "RecordStore",
    "RecoveryPolicy",
    "Resources",
    "Rule",
    "Shape",
    "SlurmOptions",
    "State",
    "Status",
    "Submission",
    "SubmissionStatus",
    "Supervisor",
    "TransientBackendError",
    "Transition",
    "VersionConflict",
    "Versioned",
    "__version__",
    "compose",
    "decide",
    "make_plan",
    "open",
    "status",
]
