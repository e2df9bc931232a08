"""SlurmJob -> (phase, cause, cancelled, restarts): the table of docs/slurm.md, in code.

Where Slurm does not say why a job ended, the cause is ``unknown`` with a detail that says what
Slurm did show; it is never guessed.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from ..._model import Cause, CauseKind, Phase, StopKind
from ._dialects import SlurmJob

LAUNCH_FAILED_SIGNAL = 53
"""22.05 reports a failed step setup (missing cwd, unwritable stdout) as 'died by signal 53'."""

RUNNING_FLAGS = frozenset(
    {"COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING", "STOPPED", "UPDATE_DB"}
)
"""Flags of a job that still holds its resources: it has not ended yet."""

NEVER_FITS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints"})
"""Pending reasons that no amount of waiting fixes: the job can never run as submitted."""

HELD_REASONS = ("JobHeldUser", "JobHeldAdmin")


@dataclass(frozen=True, slots=True)
class Classified:
    phase: Phase
    cause: Cause | None = None
    cancelled: bool = False
    restarts: int = 0
    stuck: bool = False
    """Ended for dispatch, but Slurm still holds the job (it will never run): the adapter cancels it."""
    waiting: str = ""
    """Why a released job still waits, as Slurm says (squeue's REASON): :attr:`ObjectView.waiting`."""
    stop: StopKind | None = None
    """A running job Slurm stopped (scancel, its time limit): killed by SIGKILL at KillWait's end
    (forced), or ended within it (graceful)."""


def _stop(job: SlurmJob) -> StopKind | None:
    """How a stop of a job that ran went: SIGKILL is KillWait's end; any other end came within it."""
    if job.started() is None:
        return None  # (cancelled before it ran: nothing was stopped)
    return StopKind.FORCED if job.signal == _signal.SIGKILL else StopKind.GRACEFUL


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _exit_text(job: SlurmJob) -> str:
    if job.signal:
        return f"killed by {_signame(job.signal)} ({job.signal})"
    if job.exit_status is not None:
        return f"exit status {job.exit_status}"
    return "no exit status"


def _detail(job: SlurmJob, text: str) -> str:
    bits = [f"{text}: Slurm state {job.state or '-'}"]
    if job.flags:
        bits.append(f"flags {','.join(sorted(job.flags))}")
    if job.reason and job.reason != "None":
        bits.append(f"reason {job.reason}")
    if job.description:
        bits.append(f"'{job.description}'")
    bits.append(_exit_text(job))
    return ", ".join(bits)[:1024]


_WITH_EXIT_CODE = frozenset({CauseKind.NON_ZERO_EXIT, CauseKind.NONE})
"""The causes whose exit status is the program's own (a rule on ``non-zero-exit`` matches its code);
Slurm's status of another end (an out-of-memory kill shows 0:125) says nothing about the program.
A death by a signal has no exit status: its ``signal`` is kept on every cause."""


def _ended(
    job: SlurmJob,
    kind: CauseKind,
    text: str,
    *,
    cancelled: bool = False,
    stuck: bool = False,
    stop: StopKind | None = None,
) -> Classified:
    exit_code = job.exit_status if kind in _WITH_EXIT_CODE else None
    signal = job.signal or None
    return Classified(
        phase=Phase.ENDED,
        cause=Cause(kind=kind, detail=_detail(job, text), exit_code=exit_code, signal=signal, stop=stop),
        cancelled=cancelled,
        restarts=job.restart_cnt,
        stuck=stuck,
        stop=stop,
    )


def classify(job: SlurmJob) -> Classified:
    state, flags = job.state, job.flags
    restarts = job.restart_cnt

    # Still holding resources (on its way out, or being set up): not ended yet.
    if flags & RUNNING_FLAGS:
        return Classified(phase=Phase.RUNNING, restarts=restarts)

    if state == "PENDING" or (
        not state and flags & {"REQUEUED", "REQUEUE_HOLD", "SPECIAL_EXIT", "REQUEUE_FED"}
    ):
        return _pending(job)
    if state in ("RUNNING", "SUSPENDED"):
        return Classified(phase=Phase.RUNNING, restarts=restarts)
    if state == "COMPLETED":
        return _ended(job, CauseKind.NONE, "succeeded")
    if state == "CANCELLED":
        return _ended(job, CauseKind.UNKNOWN, "cancelled", cancelled=True, stop=_stop(job))
    if state == "TIMEOUT":
        return _ended(job, CauseKind.TIME_LIMIT, "reached its time limit", stop=_stop(job))
    if state == "DEADLINE":
        return _ended(job, CauseKind.TIME_LIMIT, "reached its deadline")
    if state == "PREEMPTED":
        return _ended(job, CauseKind.PREEMPTED, "preempted")
    if state == "NODE_FAIL":
        return _ended(job, CauseKind.NODE_LOST, "a node it ran on failed")
    if state == "OUT_OF_MEMORY":
        return _ended(job, CauseKind.OUT_OF_MEMORY, "went over its memory")
    if state == "BOOT_FAIL":
        return _ended(job, CauseKind.LAUNCH_FAILED, "a node failed to boot")
    if state == "FAILED":
        return _failed(job)
    if not state and flags:
        # A flag alone that does not hold resources (REVOKED...): Slurm does not say more.
        if "REVOKED" in flags:
            return _ended(job, CauseKind.UNKNOWN, "revoked (federation)")
        return Classified(phase=Phase.RUNNING, restarts=restarts)
    # A state this adapter does not know: never guess an end.
    return Classified(phase=Phase.RUNNING, restarts=restarts)


def _pending(job: SlurmJob) -> Classified:
    reason, desc, flags = job.reason, job.description, job.flags
    launch_failed_held = "launch failed requeued held" in desc.lower() or "LAUNCH_FAILED" in flags
    if launch_failed_held and (job.hold or "REQUEUE_HOLD" in flags or reason.startswith("JobHeld")):
        # Slurm requeued it after a failed launch and holds it: it will not run unless released.
        return _ended(job, CauseKind.LAUNCH_FAILED, "launch failed, requeued and held by Slurm", stuck=True)
    if reason in ("JobHoldMaxRequeue", "MaxRequeue") or "JobHoldMaxRequeue" in desc:
        return _ended(job, CauseKind.REQUEUED, "held by Slurm after too many requeues", stuck=True)
    # Before the hold: a job that asks for more memory than a node has is left held by 24.11+ with
    # reason BadConstraints after its release was accepted; releasing it again would never end.
    if reason in NEVER_FITS:
        return _ended(job, CauseKind.NO_CAPACITY, "can never run as submitted", stuck=True)
    if job.hold or reason.startswith(HELD_REASONS):
        return Classified(phase=Phase.HELD, restarts=job.restart_cnt)
    return Classified(phase=Phase.QUEUED, restarts=job.restart_cnt, waiting=_waiting(job))


def _waiting(job: SlurmJob) -> str:
    """Slurm's reason a released job waits (``Resources``, ``Priority``, ``ReqNodeNotAvail``...),
    with its description where it has one; none while slurmctld has not looked at it yet."""
    if not job.reason or job.reason == "None":
        return ""
    text = f"pending in Slurm: reason {job.reason}"
    return (f"{text} ({job.description})" if job.description else text)[:1024]


def _failed(job: SlurmJob) -> Classified:
    reason = job.reason
    if "LAUNCH_FAILED" in job.flags:
        return _ended(job, CauseKind.LAUNCH_FAILED, "launch failed")
    if reason == "BadConstraints":
        return _ended(job, CauseKind.NO_CAPACITY, "rejected: asks for more than the nodes have")
    if reason in ("OutOfMemory",):
        return _ended(job, CauseKind.OUT_OF_MEMORY, "went over its memory")
    if job.signal == LAUNCH_FAILED_SIGNAL and reason in ("JobLaunchFailure", "RaisedSignal", "None", ""):
        return _ended(job, CauseKind.LAUNCH_FAILED, "launch failed (step setup)")
    if job.signal:
        # 22.05 says JobLaunchFailure for any death by signal; without cgroup enforcement a memory
        # overrun kill (OverMemoryKill) looks exactly like this too.
        return _ended(
            job,
            CauseKind.UNKNOWN,
            "killed by a signal (an out-of-memory kill without cgroups, a kill by hand "
            "or a crash look the same)",
        )
    if reason == "JobLaunchFailure":
        return _ended(job, CauseKind.LAUNCH_FAILED, "launch failed")
    if job.exit_status:
        return _ended(job, CauseKind.NON_ZERO_EXIT, "exited with a non-zero status")
    return _ended(job, CauseKind.UNKNOWN, "failed without a reason Slurm reports")
