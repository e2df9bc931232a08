"""dispatch's one Kubernetes client package.

- client setup: :func:`new_client`, :func:`load_configuration`, :func:`client_for`,
  :func:`kubeconfig_problem` (kubeconfig, context, in-cluster), and custom-object helpers
  (:class:`CustomObjects`, :class:`ApiError` and its :class:`NotFound`,
  :class:`Conflict`, :class:`Gone`) for the record store, the operator and the kubectl plugin;
- raw JSON requests with dispatch's error mapping (:func:`request`, :class:`KubeError`: a
  :class:`~dispatch.BackendError`) and one shared list+watch per resource (:class:`Informer`) for
  the workload kit and the record store: plain dicts through the client's transport
  (authentication, TLS, connection pool), neither generated model classes nor their choice of
  patch content types;
- the client itself (:class:`KubeClient`, from a :class:`Connection`; dispatch's own, so the
  operator never imports kubernetes_asyncio) and the :class:`Client` protocol every helper takes.
"""

from __future__ import annotations

from ._http import (
    DEFAULT_WRITE_BURST,
    DEFAULT_WRITE_QPS,
    FAIRNESS_HEADER,
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    Body,
    Client,
    KubeError,
    WriteLimiter,
    is_urgent,
    limit_writes,
    open_request,
    request,
    server_sheds_load,
    streamed,
    urgent,
)
from ._informer import Informer, OnChange, Packed, Packer, key_of, resource_version
from ._objects import (
    FIELD_MANAGER,
    ApiError,
    Conflict,
    CustomObjects,
    Gone,
    NotFound,
    WatchEvent,
    client_for,
    job_id,
    kubeconfig_problem,
    load_configuration,
    new_client,
    split_job,
)
from ._transport import Connection, KubeClient, is_watch, load_kubeconfig

__all__ = [
    "DEFAULT_WRITE_BURST",
    "DEFAULT_WRITE_QPS",
    "FAIRNESS_HEADER",
    "FIELD_MANAGER",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "ApiError",
    "Body",
    "Client",
    "Conflict",
    "Connection",
    "CustomObjects",
    "Gone",
    "Informer",
    "KubeClient",
    "KubeError",
    "NotFound",
    "OnChange",
    "Packed",
    "Packer",
    "WatchEvent",
    "WriteLimiter",
    "client_for",
    "is_urgent",
    "is_watch",
    "job_id",
    "key_of",
    "kubeconfig_problem",
    "limit_writes",
    "load_configuration",
    "load_kubeconfig",
    "new_client",
    "open_request",
    "request",
    "resource_version",
    "server_sheds_load",
    "split_job",
    "streamed",
    "urgent",
]
