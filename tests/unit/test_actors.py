"""Who is recorded as having asked: the webhook's stamp, and what the operator believes of an
annotation it reads."""

from __future__ import annotations

import pytest

from dispatch import Actor, ActorKind
from dispatch._controller.webhook import actor_of
from dispatch._dispatchjob import UNKNOWN_HUMAN, parse_actor


@pytest.mark.parametrize(
    ("username", "stamped"),
    [
        ("alice", "human:alice"),
        ("system:serviceaccount:ci:deployer", "serviceaccount:ci/deployer"),
        ("system:admin", "human:system:admin"),
        (None, "human:unknown"),
    ],
)
def test_the_webhook_stamps_a_person_or_a_service_account(username: str | None, stamped: str) -> None:
    assert actor_of({"username": username} if username else None) == stamped


def test_a_service_account_is_recorded_as_its_own_kind() -> None:
    actor = parse_actor(actor_of({"username": "system:serviceaccount:ci:deployer"}))
    assert actor == Actor(kind=ActorKind.SERVICE_ACCOUNT, id="ci/deployer")


@pytest.mark.parametrize("claimed", ["supervisor:dispatch", "scheduler:kube-scheduler"])
def test_an_annotation_claiming_dispatch_did_it_is_unknown(claimed: str) -> None:
    # Only a hand-written annotation can say so (the webhook stamps requesters only).
    assert parse_actor(claimed) == UNKNOWN_HUMAN
