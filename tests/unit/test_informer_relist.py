"""A list again (after a broken watch or a 410) hands on only what changed since the informer's last
view, and what it no longer shows as deleted: the same for a streamed list's initial events, handed
on as they arrive, as for a list of pages, handed on at its end (``Informer._changed`` and
``Informer._listed``; the streamed list itself runs against real API servers in
tests/integration/test_streamed_lists.py)."""

from __future__ import annotations

from typing import Any, cast

from dispatch._kubeclient import Client, Informer


def body(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


def test_a_list_again_hands_on_the_new_the_changed_and_the_deleted_only() -> None:
    told: list[tuple[str | None, str | None]] = []
    relisted: list[str] = []

    def changed(old: Any, new: Any) -> None:
        told.append(
            (
                old and f"{old['metadata']['name']}@{old['metadata']['resourceVersion']}",
                new and f"{new['metadata']['name']}@{new['metadata']['resourceVersion']}",
            )
        )

    informer: Informer[Any] = Informer(
        cast(Client, object()),
        "/api/v1/namespaces/ns/pods",
        label_selector="",
        on_change=changed,
        on_relist=relisted.append,
        what="pods",
    )
    for name, version in (("a", "1"), ("b", "2"), ("c", "3")):
        informer._changed(f"ns/{name}", body(name, version))
    informer._listed({"ns/a", "ns/b", "ns/c"})
    assert informer.synced.is_set()
    told.clear()
    # The list again, while the watch was down: a unchanged, b modified, c deleted, d added.
    informer.resource_version = "9"
    listed: set[str] = set()
    for name, version in (("a", "1"), ("b", "5"), ("d", "7")):
        listed.add(f"ns/{name}")
        informer._changed(f"ns/{name}", body(name, version))
    informer._listed(listed)
    assert told == [("b@2", "b@5"), (None, "d@7"), ("c@3", None)]
    assert sorted(informer.items) == ["ns/a", "ns/b", "ns/d"]
    assert relisted == ["9"]
