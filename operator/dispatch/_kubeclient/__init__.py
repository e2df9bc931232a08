"""dispatch's Kubernetes client: raw JSON requests with dispatch's error mapping, and one shared
list+watch per resource (:class:`Informer`).

Plain dicts through a ``kubernetes_asyncio`` ApiClient's own transport (authentication, TLS,
connection pool): the workload kit reads and writes whole objects and merge or JSON patches, and
wants neither the generated model classes nor their choice of patch content types.
"""

from __future__ import annotations

from ._http import JSON, JSON_PATCH, MERGE_PATCH, Body, KubeError, open_request, request
from ._informer import Informer, OnChange, key_of, resource_version

__all__ = [
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "Body",
    "Informer",
    "KubeError",
    "OnChange",
    "key_of",
    "open_request",
    "request",
    "resource_version",
]
