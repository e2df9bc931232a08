"""Every name dispatch writes into Kubernetes, in one place, under the project's own API group.

Condition types and reasons follow kstatus: ``Ready`` summarises, ``Reconciling`` and ``Stalled`` are
present only while true; ``Succeeded``/``Failed`` carry the outcome for ``kubectl wait``.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "dispatch.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DispatchJob"
PLURAL: Final = "dispatchjobs"
SINGULAR: Final = "dispatchjob"
SHORT_NAME: Final = "dj"
CATEGORY: Final = "dispatch"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# Labels and annotations (on DispatchJobs and on the objects dispatch creates).
LABEL_JOB: Final = f"{GROUP}/job"
LABEL_SUBMISSION: Final = f"{GROUP}/submission"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "dispatch"
RUNTIME_PATCH_MANAGER: Final = f"{GROUP}/dispatch"
"""The ``manager`` of the runtime patch a TrainJob carries (its pod templates' dispatch labels)."""
ANNOTATION_SUBMITTED_BY: Final = f"{GROUP}/submitted-by"
ANNOTATION_CANCELLED_BY: Final = f"{GROUP}/cancelled-by"
ANNOTATION_SUSPENDED_BY: Final = f"{GROUP}/suspended-by"
"""Who last set ``spec.suspend`` (to true or back to false), stamped by the admission webhook."""
ANNOTATION_RETRIED_BY: Final = f"{GROUP}/retried-by"
"""Who last raised ``spec.retry.count``, stamped by the admission webhook."""
FINALIZER: Final = f"{GROUP}/finalizer"
# On every object dispatch creates: someone else's deletion leaves the object readable (with its
# deletionTimestamp) until dispatch has recorded how it ended, so the record is the same whether or
# not a supervisor was running when it happened.
OBJECT_FINALIZER: Final = f"{GROUP}/record-before-delete"
PROGRESS_PREFIX: Final = GROUP  # kopf's progress annotations, renamed into our group
REPORTING_COMPONENT: Final = "dispatch-operator"
LEASE_NAME: Final = "dispatch-operator"

# Condition types.
COND_READY: Final = "Ready"
COND_RECONCILING: Final = "Reconciling"
COND_STALLED: Final = "Stalled"
COND_SUCCEEDED: Final = "Succeeded"
COND_FAILED: Final = "Failed"

# Condition and event reasons (CamelCase, always set).
REASON_PLANNED: Final = "Planned"
REASON_UNENFORCEABLE: Final = "UnenforceableRule"
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_SUBMITTED: Final = "Submitted"
REASON_AUTHORIZED: Final = "SubmissionAuthorized"
REASON_CREATED: Final = "ObjectCreated"
REASON_RELEASED: Final = "ObjectReleased"
REASON_RUNNING: Final = "Running"
REASON_PENDING: Final = "Pending"
REASON_RECOVERING: Final = "Recovering"
REASON_SUSPENDED: Final = "Suspended"
REASON_RESUMED: Final = "Resumed"
REASON_RETRIED: Final = "Retried"
REASON_SUCCEEDED: Final = "Succeeded"
REASON_FAILED: Final = "Failed"
REASON_CANCELLED: Final = "Cancelled"
REASON_ORPHAN_ENDED: Final = "OrphanEnded"
REASON_OBJECT_ENDED: Final = "ObjectEnded"
REASON_SETTLED: Final = "Settled"
REASON_EXPIRED: Final = "Expired"
"""A settled job deleted once its time to live passed; the note carries its final record in brief."""
REASON_BACKEND_ERROR: Final = "BackendError"
REASON_WRITE_CONFLICT: Final = "RecordWriteConflict"

EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"

# Observability and admission (webhook, events, metrics).
REPORTING_CONTROLLER: Final = f"{GROUP}/{REPORTING_COMPONENT}"
"""events.k8s.io/v1 ``reportingController`` of every Event dispatch posts."""
WEBHOOK_VALIDATE_ID: Final = "validate-dispatchjob"
"""kopf handler id of the validating webhook; served at path ``/validate-dispatchjob``."""
WEBHOOK_MUTATE_ID: Final = "mutate-dispatchjob"
"""kopf handler id of the mutating webhook; served at path ``/mutate-dispatchjob``."""
WEBHOOK_PORT: Final = 9443
METRICS_PORT: Final = 8080
METRICS_PATH: Final = "/metrics"

# Kubeflow adapter (appended by the Kubeflow adapter's engineer).
ANNOTATION_ENDED: Final = f"{GROUP}/ended"
# Set by the release itself (the same write): a released object found suspended again was held by
# someone else (Kueue's preemption, a person), and dispatch never releases it a second time.
ANNOTATION_RELEASED: Final = f"{GROUP}/released"
"""On a PyTorchJob the adapter stopped itself (suspended, pods deleted): the cause, as JSON."""
ANNOTATION_NO_CAPACITY_AFTER: Final = f"{GROUP}/no-capacity-after-seconds"
ANNOTATION_RESTART_BUDGET: Final = f"{GROUP}/restart-budget"
"""On a PyTorchJob built to restart in place: the budget of the scheduler-enforced rule."""
KUBEFLOW_LABEL_JOB_NAME: Final = "training.kubeflow.org/job-name"
KUBEFLOW_LABEL_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
KUBEFLOW_LABEL_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"
GPU_RESOURCE: Final = "nvidia.com/gpu"

# Operator (appended by the operator's engineer).
REASON_BACKEND_NOT_CONFIGURED: Final = "BackendNotConfigured"
"""Condition reason: this operator has no adapter for the DispatchJob's spec.backend (not final)."""
EVENT_NAME_PREFIX: Final = "dispatch-event-"
"""kopf's own Events (handler failures) are named with this prefix."""

# Observed status fields (what an observer sees now, for `kubectl get`; not part of the record).
STATUS_OBSERVED_STATE: Final = "observedState"
"""status field: the state status shows now (``running``, ``cancelling`` included), not the recorded one."""
STATUS_OBSERVED_CAUSE: Final = "observedCause"
"""status field: the cause status shows now; absent while a run is running or none ended yet."""
STATUS_OBSERVED_NOTE: Final = "observedNote"
"""status field: what the scheduler shows of the current object that is not dispatch's doing (held
outside dispatch, and by whom); absent otherwise."""

# Kueue: the labels Kueue reads on a job, and what dispatch keeps on a queued object.
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
"""Only v1beta2 is read: v1beta1 goes through Kueue's conversion webhook."""
KUEUE_LABEL_QUEUE: Final = f"{KUEUE_GROUP}/queue-name"
"""Kueue manages a job only while it carries this label (manageJobsWithoutQueueName false): dispatch
writes it in the release, never at create, and removes it in a stop."""
KUEUE_LABEL_PRIORITY_CLASS: Final = f"{KUEUE_GROUP}/priority-class"
ANNOTATION_QUEUE: Final = f"{GROUP}/queue"
"""On a queued object, from create: the LocalQueue its release writes into Kueue's label (an
annotation, which Kueue does not read, so the held object is not Kueue's yet)."""
ANNOTATION_PRIORITY_CLASS: Final = f"{GROUP}/priority-class"
"""On a queued object, from create: the WorkloadPriorityClass its release writes into Kueue's label."""
REASON_HELD_OUTSIDE: Final = "HeldOutside"
"""Event reason: the current object is held by someone else (suspended by another controller after
dispatch released it); the note says by whom, as ``status.observedNote`` does."""
REASON_UNQUEUEABLE: Final = "QueueRefused"
"""Condition reason: spec.queue names a LocalQueue, but Kueue cannot queue this job here (a backend
Kueue does not integrate, or a cluster that does not serve workloads.kueue.x-k8s.io)."""

JWT_FRAGMENT: Final = r"eyJ[A-Za-z0-9_-]{2,}(?:\.[A-Za-z0-9_-]*)*"
"""Any piece of a JSON Web Token (a Slurm JWT, a service-account token), however it was cut: each
of its first two parts is base64url of a JSON object, so it starts ``eyJ`` (``{"``). Scrubbed from
every error, status, Event and log line, with what follows it up to the next character no token
holds."""
