"""What a kit backend's view of a recorded scenario must say, checked the same way for every kind:
its phase, its cause's kind, exit code and words, and the restarts on the record.
"""

from __future__ import annotations

from dispatch._model import CauseKind, ObjectView, Phase

Expected = tuple[Phase, CauseKind, int | None, str, int]
"""(phase, cause kind, exit code or None when any, a word of the cause's detail, restarts)."""


def assert_classified(view: ObjectView, expected: Expected) -> None:
    phase, kind, exit_code, word, restarts = expected
    assert view.phase is phase, view
    assert view.cause is not None
    assert view.cause.kind is kind, view.cause
    if exit_code is not None:
        assert view.cause.exit_code == exit_code
    assert word in view.cause.detail, view.cause
    assert view.restarts == restarts, view
