"""kopf settings for the operator: everything kopf writes is renamed into the project's group.

kopf watches no resource (:mod:`dispatch._controller.loop` supervises, and owns the finalizer); it serves
the admission webhooks, start-up and readiness. The names below stay set so that, should a handler
ever be registered, kopf would write nothing outside the project's group and would use the loop's
finalizer rather than add a second one:

* progress and diff-base annotations under ``dispatch.dev/`` (never ``kopf.zalando.org``), never in
  ``.status``, which holds only the record;
* the finalizer ``dispatch.dev/finalizer``;
* kopf's own Events reported by ``dispatch.dev/dispatch-operator``, only for warnings and errors
  (dispatch posts its own Events for transitions);
* no peering (``--leader-elect`` uses a Lease instead; the record's compare-and-swap is what keeps
  two replicas safe either way).
"""

from __future__ import annotations

import logging

import kopf

from .._constants import EVENT_NAME_PREFIX, FINALIZER, GROUP, PROGRESS_PREFIX, REPORTING_COMPONENT

REPORTING: str = f"{GROUP}/{REPORTING_COMPONENT}"


def operator_settings(*, scanning: bool = False) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PROGRESS_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PROGRESS_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.reporting_component = REPORTING
    settings.posting.event_name_prefix = EVENT_NAME_PREFIX
    settings.posting.level = logging.WARNING
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # Static: the namespaces given and the DispatchJob CRD present at startup (no RBAC on CRDs or
    # namespaces needed).
    settings.scanning.disabled = not scanning
    # Daemons are stopped by their own `stopped` flag at once; do not wait a minute for them.
    settings.background.cancellation_polling = 1.0
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    return settings
