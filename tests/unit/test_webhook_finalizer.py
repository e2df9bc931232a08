"""The mutating webhook gives a new DispatchJob the loop's finalizer, and never puts it back."""

from __future__ import annotations

from dispatch._constants import FINALIZER
from dispatch._controller.webhook import finalizers_to_set


def test_a_created_job_gets_the_finalizer_after_any_it_has() -> None:
    assert finalizers_to_set({"metadata": {}}, "CREATE") == [FINALIZER]
    assert finalizers_to_set({"metadata": {"finalizers": ["x/y"]}}, "CREATE") == ["x/y", FINALIZER]


def test_nothing_to_add_when_it_is_there_or_the_object_is_going() -> None:
    assert finalizers_to_set({"metadata": {"finalizers": [FINALIZER]}}, "CREATE") is None
    assert finalizers_to_set({"metadata": {"deletionTimestamp": "2026-12-01T00:00:00Z"}}, "CREATE") is None


def test_an_update_never_puts_it_back() -> None:
    # The loop removes it to let a deleted job go: an UPDATE re-adding it would hold the job forever.
    assert finalizers_to_set({"metadata": {}}, "UPDATE") is None
    assert finalizers_to_set({"metadata": {}}, None) is None
