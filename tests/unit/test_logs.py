"""Logs: text or JSON lines with the decision's context, and never a credential."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from dispatch._controller import logs


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def test_json_lines_carry_the_decision_context(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure("json", "INFO", stream=out)
    log = logging.getLogger("dispatch.supervisor")
    log.info(
        "job %s submission %s: %s (cause %s)",
        "ns/finetune",
        2,
        "Authorize",
        "preempted",
        extra={"job": "ns/finetune", "submission": 2, "step": "Authorize", "cause": "preempted"},
    )
    log.debug("not shown at INFO")
    (line,) = out.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["message"] == "job ns/finetune submission 2: Authorize (cause preempted)"
    assert entry["level"] == "INFO"
    assert entry["logger"] == "dispatch.supervisor"
    assert (entry["job"], entry["submission"], entry["step"], entry["cause"]) == (
        "ns/finetune",
        2,
        "Authorize",
        "preempted",
    )
    assert entry["time"].endswith("+00:00")


def test_json_without_context_has_no_context_fields(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure("json", logging.INFO, stream=out)
    logging.getLogger("dispatch.x").warning("plain")
    entry = json.loads(out.getvalue())
    assert set(entry) == {"time", "level", "logger", "message"}


def test_text_lines_append_the_context(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure("text", "INFO", stream=out)
    logging.getLogger("dispatch.supervisor").info(
        "step", extra={"job": "ns/a", "submission": 1, "step": "Create"}
    )
    line = out.getvalue().strip()
    assert line.endswith("INFO dispatch.supervisor: step [job=ns/a submission=1 step=Create]")


def test_configure_replaces_its_own_handler(restore_root: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    logs.configure("text", "INFO", stream=first)
    logs.configure("json", "INFO", stream=second)
    logging.getLogger("dispatch.x").info("once")
    assert first.getvalue() == ""
    assert json.loads(second.getvalue())["message"] == "once"


def test_bad_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text' or 'json"):
        logs.configure("xml")  # type: ignore[arg-type]


JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEyMyJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLXBhcnQ"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer s3cr3t-t0ken-value", "s3cr3t-t0ken-value"),
        ("headers={'Authorization': 'Bearer abcdefgh12345678'}", "abcdefgh12345678"),
        ('{"authorization": "Basic dXNlcjpwYXNz"}', "dXNlcjpwYXNz"),
        ("calling with bearer abcdefghijklmnop", "abcdefghijklmnop"),
        ("X-SLURM-USER-TOKEN: tok-1234567890", "tok-1234567890"),
        ("token=abc123secret&user=ada", "abc123secret"),
        ('{"password": "hunter2"}', "hunter2"),
        (f"service account token {JWT} rejected", JWT),
        # An echoing proxy's 502 cut after 80 characters: header and half the claims, no dot after.
        (f"502 Bad Gateway: X-SLURM-USER-TOKEN echoed {JWT[:80]}", JWT[:80]),
        (f"upstream said <{JWT[:40]}>", JWT[:40]),
        (f"claims only: {JWT.split('.')[1]}", JWT.split(".")[1]),
        ("key: -----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----", "MIIB"),
    ],
)
def test_redact(text: str, secret: str) -> None:
    cleaned = logs.redact(text)
    assert secret not in cleaned
    assert logs.REDACTED in cleaned


def test_redact_leaves_ordinary_text() -> None:
    text = "job ns/finetune submission 2: Authorize (cause preempted); token bucket has 5 left"
    assert logs.redact(text) == text


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_secrets_never_reach_the_output(restore_root: None, fmt: logs.Format) -> None:
    out = io.StringIO()
    logs.configure(fmt, "DEBUG", stream=out)
    log = logging.getLogger("dispatch.slurm")
    log.info("request headers %s", {"Authorization": "Bearer very-secret-value"})
    try:
        raise RuntimeError(f"401 for token {JWT}")
    except RuntimeError:
        log.exception("call failed")
    text = out.getvalue()
    assert "very-secret-value" not in text
    assert JWT not in text
    assert text.count(logs.REDACTED) >= 2


def test_filter_redacts_for_other_handlers(restore_root: None) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "auth %s", ("Bearer abcdefghijkl",), None)
    assert logs.RedactFilter().filter(record)
    assert record.getMessage() == "auth Bearer [REDACTED]"
