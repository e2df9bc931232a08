"""Logging for the operator: readable text or one JSON object per line, never a secret.

The supervisor logs one line per step with ``extra={"job", "submission", "step", "cause"}``; the
JSON format lifts those fields to the top level so a log pipeline can filter on them. Every handler
installed here carries a :class:`RedactFilter`, and both formatters redact their final output too
(tracebacks included), so a bearer token, an ``Authorization`` header or a password that ends up in
a message or an exception is replaced by ``[REDACTED]`` before it is written.

Use::

    from dispatch._controller import logs
    logs.configure("json", "INFO")
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Final, Literal, TextIO

from .._constants import JWT_FRAGMENT

Format = Literal["text", "json"]

REDACTED: Final = "[REDACTED]"
FIELDS: Final = ("job", "submission", "step", "cause")
"""Context fields lifted from a record's ``extra`` into each JSON line (and appended to text lines)."""

_SECRET_PATTERNS: Final = (
    # Authorization / Proxy-Authorization headers, whatever the scheme, in "k: v", "k=v" or JSON form.
    re.compile(r"""(?i)((?:proxy-)?authorization["']?\s*[:=]\s*["']?)(?:bearer\s+|basic\s+)?[^\s"',;}]+"""),
    # A bare "Bearer <token>" or "Basic <credentials>".
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{8,}"),
    # key=value / "key": "value" for names that hold secrets (token, password, secret, api key...).
    re.compile(
        r"""(?i)((?:x-slurm-user-token|[a-z_-]*token|password|passwd|secret|api[_-]?key|client[_-]?key)"""
        r"""["']?\s*[:=]\s*["']?)[^\s"',;}&]+"""
    ),
    # JSON Web Tokens (service-account tokens, Slurm JWTs) wherever they appear, whole or cut.
    re.compile(rf"(){JWT_FRAGMENT}"),
    # PEM private keys.
    re.compile(r"()-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
)


def redact(text: str) -> str:
    """``text`` with anything that looks like a credential replaced by ``[REDACTED]``."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


class RedactFilter(logging.Filter):
    """Redacts the formatted message of every record (the arguments are merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the formatter to report
            return True
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg = cleaned
            record.args = None
        return True


class TextFormatter(logging.Formatter):
    """``time level logger: message [job=... submission=... step=... cause=...]``, redacted."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{k}={getattr(record, k)}" for k in FIELDS if _present(record, k))
        if context:
            head, sep, tail = line.partition("\n")
            line = f"{head} [{context}]{sep}{tail}"
        return redact(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields, any exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            if _present(record, key):
                entry[key] = _plain(getattr(record, key))
        final = getattr(record, "final_record", None)  # a deleted job's record in brief, kept whole
        if isinstance(final, dict):
            entry["record"] = final
        ref = getattr(record, "k8s_ref", None)  # kopf's per-object loggers attach the object
        if isinstance(ref, dict):
            entry["object"] = {k: ref[k] for k in ("namespace", "name", "kind") if k in ref}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return redact(json.dumps(entry, ensure_ascii=False, default=str))


def _present(record: logging.LogRecord, key: str) -> bool:
    return getattr(record, key, None) is not None


def _plain(value: object) -> object:
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


_INSTALLED: Final = "_dispatch_logs"


def configure(
    format: Format = "text",
    level: int | str = logging.INFO,
    *,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Route every log record (root logger) through one redacting handler in ``format``.

    Calling it again replaces the handler it installed before; handlers installed by others are
    left alone (but get a :class:`RedactFilter` too). Returns the handler.
    """
    if format not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', not {format!r}")
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _INSTALLED, False):
            root.removeHandler(old)
            old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _INSTALLED, True)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    handler.addFilter(RedactFilter())
    for other in root.handlers:
        if not any(isinstance(f, RedactFilter) for f in other.filters):
            other.addFilter(RedactFilter())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
