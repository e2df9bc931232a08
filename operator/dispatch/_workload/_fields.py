"""What the kit reads of dispatch's own fields on a body: its owner, thresholds, times and details.

Pure functions of one object, shared by the classification and Kueue's reading of a Workload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from .._constants import (
    ANNOTATION_NO_CAPACITY_AFTER,
    ANNOTATION_RESTART_BUDGET,
    LABEL_JOB,
    LABEL_SUBMISSION,
)
from .._model import Cause

DEFAULT_NO_CAPACITY_AFTER: Final = 300
MAX_DETAIL: Final = 1024
"""The longest detail of a cause: what the record and the status keep of it."""


def object_id(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def owner_of(body: Mapping[str, Any]) -> tuple[str, int] | None:
    """(job id, submission) from dispatch's labels, or None when they are missing or malformed."""
    meta = body.get("metadata", {})
    labels = meta.get("labels") or {}
    name, n = labels.get(LABEL_JOB), labels.get(LABEL_SUBMISSION)
    if not name or not n:
        return None
    try:
        submission = int(n)
    except ValueError:
        return None
    return f"{meta.get('namespace', '')}/{name}", submission


def no_capacity_after(body: Mapping[str, Any]) -> int:
    raw = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_NO_CAPACITY_AFTER)
    try:
        return int(raw) if raw is not None else DEFAULT_NO_CAPACITY_AFTER
    except ValueError:
        return DEFAULT_NO_CAPACITY_AFTER


def restart_budget(body: Mapping[str, Any]) -> int | None:
    raw = (body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RESTART_BUDGET)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def ended_annotation(cause: Cause) -> str:
    return json.dumps(cause.model_dump(mode="json", exclude_none=True), separators=(",", ":"))


def parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def detail(*parts: object) -> str:
    text = ": ".join(str(p) for p in parts if p not in (None, ""))
    return text[:MAX_DETAIL]


def status_conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in obj.get("status", {}).get("conditions") or []}


def true_condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's status condition ``kind`` when it is True, else None."""
    found = status_conditions(obj).get(kind)
    return found if found is not None and found.get("status") == "True" else None
