"""The operator as a process that SIGKILLs itself right after a chosen step: a crash at an exact
point of the submission protocol, for the integration tests that restart it.

    DISPATCH_TEST_CRASH_AFTER=Create:1 python -m tests.support.crash_after --kubeconfig ... --namespace NS

runs ``dispatch-operator`` with its arguments, and a :class:`CrashAfter` listener told of every step
first (``dispatch._controller.main.main``'s ``listeners``). ``Step[:n]`` is a step's class name,
optionally with a submission number. The operator itself reads no such variable:
``tests.integration.conftest.OperatorProcess`` starts this module instead of ``dispatch._controller``
when the variable is set.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Final

from dispatch._decide import Step
from dispatch._model import Record

CRASH_ENV: Final = "DISPATCH_TEST_CRASH_AFTER"

log = logging.getLogger("dispatch.operator")


class CrashAfter:
    """A listener that SIGKILLs this process after a given step (see :data:`CRASH_ENV`)."""

    def __init__(self, spec: str) -> None:
        step, _, n = spec.partition(":")
        self.step = step
        self.submission = int(n) if n else None

    def stepped(self, job: str, step: Step, before: Record, after: Record | None) -> None:
        if type(step).__name__ != self.step:
            return
        n = getattr(step, "submission", None)
        if n is None:
            n = before.current.n if before.current is not None else 0
        if self.submission is None or n == self.submission:
            log.warning("%s=%s: killing this process after %s of %s", CRASH_ENV, self.step, step, job)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def conflicted(self, job: str) -> None:
        pass

    def errored(self, job: str, step: Step, error: Exception) -> None:
        pass


def crashing_main(argv: list[str]) -> int:
    """``dispatch-operator argv``, killed after the step :data:`CRASH_ENV` names (if it names one)."""
    # Imported here, as the operator's entry point does it (kubernetes_asyncio blocked), so that
    # importing CRASH_ENV leaves the importing process as it was.
    import dispatch._controller.__main__  # noqa: F401  (blocks kubernetes_asyncio before kopf loads)
    from dispatch._controller.main import main

    point = os.environ.get(CRASH_ENV)
    return main(argv, listeners=[CrashAfter(point)] if point else [])


if __name__ == "__main__":
    sys.exit(crashing_main(sys.argv[1:]))
