"""RBAC rules every backend whose jobs run as pods needs: declared once, named by each backend."""

from __future__ import annotations

from typing import Final

from .._registry import PolicyRule

POD_RULE: Final = PolicyRule(
    ("",),
    ("pods",),
    ("get", "list", "watch", "delete", "deletecollection"),
    why="Pods of the backend's objects: read to classify how a submission ended (preemption, eviction, "
    "OOM, unschedulable = no capacity). delete/deletecollection only because a cluster without a garbage "
    "collector leaves a deleted object's pods behind: the operator deletes them in one request with the "
    "label selector dispatch.dev/job=<job>,dispatch.dev/submission=<n>, i.e. only pods of a submission it "
    "ended. No other write.",
)
NODE_RULE: Final = PolicyRule(
    ("",),
    ("nodes",),
    ("get",),
    why="The node a failed pod ran on: gone (404) or not Ready means the cause is node-lost. Read only.",
    cluster_scoped=True,
)
POD_EVENT_RULE: Final = PolicyRule(
    ("",),
    ("events",),
    ("list",),
    why="The scheduler's Preempted and the taint manager's TaintManagerEviction events of the backend's "
    "pods, read when the pods are gone (after a restart of the operator).",
)
