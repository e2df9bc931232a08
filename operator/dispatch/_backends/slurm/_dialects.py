"""The API dialects: what changes between slurmrestd's v0.0.38 and v0.0.40+ job APIs.

Each dialect builds request paths and bodies, and turns a job record into a neutral
:class:`SlurmJob`. Every one is tested live and with responses recorded from the real servers
(``hack/slurm-record.py``): v0.0.38 from Slurm 22.05 (Debian 12), v0.0.40-42 from 24.11 (Debian 13),
v0.0.42-45 from 26.05 (Debian unstable).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..._errors import TransientBackendError

BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
"""Slurm's base job states (``JOB_STATE_BASE``); anything else in a state is a flag."""


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One Slurm job, whatever the API version it came through."""

    job_id: int
    name: str = ""
    comment: str = ""
    state: str = ""
    """The base state (``PENDING``, ``COMPLETED``...); empty when the API only showed a flag."""
    flags: frozenset[str] = frozenset()
    """State flags (``COMPLETING``, ``REQUEUED``, ``LAUNCH_FAILED``...)."""
    reason: str = ""
    description: str = ""
    exit_status: int | None = None
    """The process's exit status when it exited normally."""
    signal: int | None = None
    """The signal that ended it, when it was killed by one."""
    restart_cnt: int = 0
    hold: bool = False
    user_name: str = ""
    requeue: bool | None = None
    submit_time: int | None = None
    """When slurmctld took the submission (epoch seconds, its clock)."""
    start_time: int | None = None
    """When it began running (epoch seconds, slurmctld's clock); while it is pending, Slurm's
    estimate of when it will (see :meth:`started`)."""

    def started(self) -> int | None:
        """When it began running, None while pending: a pending job's ``start_time`` is Slurm's
        estimate, and a job cancelled while pending shows no start at all."""
        if self.start_time is None or self.state in ("", "PENDING"):
            return None
        return self.start_time


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """A neutral job description; the dialect renders it.

    There is no requeue field: every job is submitted not requeueable, because Slurm's requeue
    enforces no recovery rule exactly (docs/slurm.md) and each recovery is dispatch's to decide.
    """

    script: str
    name: str
    comment: str
    environment: Mapping[str, str]
    hold: bool = True
    partition: str | None = None
    time_limit_minutes: int | None = None
    warning: tuple[str, int] | None = None
    """``--signal``: this signal (``USR1``), so many seconds before the time limit, to the job's
    steps: the script runs the program as one (``srun``), since slurmrestd cannot ask for the
    batch shell (``B:`` is parsed by sbatch alone)."""
    cpus_per_task: int | None = None
    memory_per_node_mb: int | None = None
    nodes: int = 1
    working_directory: str = "/tmp"
    standard_output: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def _int(v: Any) -> int | None:
    """A plain int, or v0.0.39+'s NO_VAL struct ``{"set","infinite","number"}``."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite", False):
            return None
        n = v.get("number")
        return int(n) if isinstance(n, int | float) and not isinstance(n, bool) else None
    return None


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _state_words(raw: Any) -> tuple[str, frozenset[str]]:
    """v0.0.40+'s ``job_state`` (a list: base state and flags) as (base, flags)."""
    words = [raw] if isinstance(raw, str) else [w for w in (raw or []) if isinstance(w, str)]
    words = [w.upper() for w in words]
    base = next((w for w in words if w in BASE_STATES), "")
    return base, frozenset(w for w in words if w != base)


def _wait_status(raw: int | None) -> tuple[int | None, int | None]:
    """Split a raw wait status into (exit status, signal)."""
    if raw is None:
        return None, None
    sig = raw & 0x7F
    if sig:
        return None, sig
    return (raw >> 8) & 0xFF, None


class Dialect:
    version: ClassVar[str] = ""
    update_time_accepted: ClassVar[bool] = True
    """The job listing takes ``update_time`` (24.11's v0.0.40 and v0.0.41 answer it 422)."""

    @property
    def prefix(self) -> str:
        return f"/slurm/{self.version}"

    # -- paths
    def ping_path(self) -> str:
        return f"{self.prefix}/ping"

    def jobs_path(self) -> str:
        return f"{self.prefix}/jobs"

    def job_path(self, job_id: int | str) -> str:
        return f"{self.prefix}/job/{job_id}"

    def submit_path(self) -> str:
        return f"{self.prefix}/job/submit"

    def lookup_path(self) -> str | None:
        """The path of one request that asks about several jobs by id (``job_id`` CSV), if any."""
        return None

    def probe_path(self) -> str:
        """A cheap request that slurmctld must authenticate (a ping succeeds with a bad token on 24.11+)."""
        return f"{self.prefix}/licenses"

    # -- bodies
    def submit_body(self, req: SubmitRequest) -> dict[str, Any]:
        raise NotImplementedError

    def release_body(self) -> dict[str, Any]:
        return {"hold": False}

    def bulk_cancel(self, job_ids: list[int]) -> tuple[str, dict[str, Any]] | None:
        """(path, body) of one request that cancels all of ``job_ids``, if the dialect has one."""
        return None

    # -- parsing
    def parse_submit(self, body: Mapping[str, Any]) -> int | None:
        jid = body.get("job_id")
        if isinstance(jid, int) and not isinstance(jid, bool):
            return jid
        if isinstance(jid, str) and jid.isdigit():
            return int(jid)
        result = body.get("result")
        if isinstance(result, dict):
            return self.parse_submit(result)
        return None

    def parse_jobs(self, body: Mapping[str, Any]) -> list[SlurmJob]:
        jobs = body.get("jobs")
        if not isinstance(jobs, list):
            raise TransientBackendError(f"slurmrestd {self.version}: job list without a 'jobs' array")
        out: list[SlurmJob] = []
        for rec in jobs:
            if not isinstance(rec, dict):
                raise TransientBackendError(f"slurmrestd {self.version}: a job record is not an object")
            out.append(self.parse_job(rec))
        return out

    def parse_job(self, rec: Mapping[str, Any]) -> SlurmJob:
        raise NotImplementedError

    def check_update(self, body: Mapping[str, Any]) -> list[tuple[int, str]]:
        """Per-job errors in an update answer (v0.0.40+ ``results``); empty when all went well."""
        return []

    @staticmethod
    def _job_id(rec: Mapping[str, Any], version: str) -> int:
        jid = rec.get("job_id")
        if not isinstance(jid, int) or isinstance(jid, bool):
            raise TransientBackendError(f"slurmrestd {version}: a job record has no integer job_id")
        return jid


class V0038(Dialect):
    """Slurm 22.05 (and 23.02/23.11, deprecated there)."""

    version = "v0.0.38"

    def submit_body(self, req: SubmitRequest) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": req.name,
            "comment": req.comment,
            "hold": req.hold,
            "environment": dict(req.environment),  # required in v0.0.38, a dict
            "current_working_directory": req.working_directory,
            "nodes": str(req.nodes),
        }
        # Never requeueable. "requeue": false is silently ignored by v0.0.38; "no_requeue" is what works.
        job["no_requeue"] = True
        if req.standard_output:
            job["standard_output"] = req.standard_output
        if req.partition:
            job["partition"] = req.partition
        if req.time_limit_minutes is not None:
            job["time_limit"] = req.time_limit_minutes
        if req.warning is not None:
            number = signal.Signals[f"SIG{req.warning[0]}"].value
            job["signal"] = f"{number}@{req.warning[1]}"
        if req.cpus_per_task is not None:
            job["cpus_per_task"] = req.cpus_per_task
        if req.memory_per_node_mb is not None:
            job["memory_per_node"] = req.memory_per_node_mb
        job.update(req.extra)
        return {"script": req.script, "job": job}

    def parse_job(self, rec: Mapping[str, Any]) -> SlurmJob:
        raw_state = _str(rec.get("job_state")).upper()
        # v0.0.38 shows one word: the base state, or a flag such as COMPLETING instead of it.
        state, flags = (raw_state, frozenset()) if raw_state in BASE_STATES else ("", frozenset({raw_state}))
        exit_status, sig = _wait_status(_int(rec.get("exit_code")))
        prio = _int(rec.get("priority"))
        reason = _str(rec.get("state_reason"))
        return SlurmJob(
            job_id=self._job_id(rec, self.version),
            name=_str(rec.get("name")),
            comment=_str(rec.get("comment")),
            state=state,
            flags=flags - {""},
            reason=reason,
            description=_str(rec.get("state_description")),
            exit_status=exit_status,
            signal=sig,
            restart_cnt=_int(rec.get("restart_cnt")) or 0,
            hold=state == "PENDING" and prio == 0 and reason.startswith("JobHeld"),
            user_name=_str(rec.get("user_name")),
            requeue=rec["requeue"] if isinstance(rec.get("requeue"), bool) else None,
            submit_time=_int(rec.get("submit_time")) or None,
            start_time=_int(rec.get("start_time")) or None,
        )


class V0040(Dialect):
    """Slurm 23.11 to 25.05: data_parser v0.0.40 (strict schemas)."""

    version = "v0.0.40"
    script_in_job: ClassVar[bool] = False
    update_time_accepted = False

    def submit_body(self, req: SubmitRequest) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": req.name,
            "comment": req.comment,
            "hold": req.hold,
            "requeue": False,  # never requeueable; a real boolean from v0.0.39 on, and false is honoured
            "environment": [f"{k}={v}" for k, v in req.environment.items()],
            "current_working_directory": req.working_directory,
            "minimum_nodes": req.nodes,
            "maximum_nodes": req.nodes,
        }
        if req.standard_output:
            job["standard_output"] = req.standard_output
        if req.partition:
            job["partition"] = req.partition
        if req.time_limit_minutes is not None:
            job["time_limit"] = {"set": True, "infinite": False, "number": req.time_limit_minutes}
        if req.warning is not None:
            job["kill_warning_signal"] = req.warning[0]
            job["kill_warning_delay"] = {"set": True, "infinite": False, "number": req.warning[1]}
        if req.cpus_per_task is not None:
            job["cpus_per_task"] = req.cpus_per_task
        if req.memory_per_node_mb is not None:
            job["memory_per_node"] = {"set": True, "infinite": False, "number": req.memory_per_node_mb}
        job.update(req.extra)
        if self.script_in_job:
            job["script"] = req.script
            return {"job": job}
        return {"script": req.script, "job": job}

    def bulk_cancel(self, job_ids: list[int]) -> tuple[str, dict[str, Any]] | None:
        return f"{self.prefix}/jobs", {"jobs": [str(j) for j in job_ids]}

    def lookup_path(self) -> str | None:
        return f"{self.prefix}/jobs/state/"

    def parse_states(self, body: Mapping[str, Any]) -> dict[int, tuple[str, frozenset[str]]]:
        """``GET /jobs/state``: job id -> (base state, flags)."""
        jobs = body.get("jobs")
        if not isinstance(jobs, list):
            raise TransientBackendError(f"slurmrestd {self.version}: job states without a 'jobs' array")
        out: dict[int, tuple[str, frozenset[str]]] = {}
        for rec in jobs:
            if not isinstance(rec, dict):
                raise TransientBackendError(f"slurmrestd {self.version}: a job state is not an object")
            base, flags = _state_words(rec.get("state", rec.get("job_state")))
            jid = rec.get("job_id")
            if isinstance(jid, str) and jid.isdigit():
                jid = int(jid)  # /jobs/state writes the id as a string (recorded on 24.11 and 26.05)
            out[self._job_id({"job_id": jid}, self.version)] = (base, flags)
        return out

    def parse_job(self, rec: Mapping[str, Any]) -> SlurmJob:
        base, flags = _state_words(rec.get("job_state"))
        exit_status, sig = self._exit(rec.get("exit_code"))
        hold = rec.get("hold")
        return SlurmJob(
            job_id=self._job_id(rec, self.version),
            name=_str(rec.get("name")),
            comment=_str(rec.get("comment")),
            state=base,
            flags=flags,
            reason=_str(rec.get("state_reason")),
            description=_str(rec.get("state_description")),
            exit_status=exit_status,
            signal=sig,
            restart_cnt=_int(rec.get("restart_cnt")) or 0,
            hold=hold if isinstance(hold, bool) else (base == "PENDING" and _int(rec.get("priority")) == 0),
            user_name=_str(rec.get("user_name")),
            requeue=rec["requeue"] if isinstance(rec.get("requeue"), bool) else None,
            submit_time=_int(rec.get("submit_time")) or None,
            start_time=_int(rec.get("start_time")) or None,
        )

    @staticmethod
    def _exit(v: Any) -> tuple[int | None, int | None]:
        """``{"status":[..],"return_code":{..},"signal":{"id":{..},"name":..}}``, or v0.0.39's raw one."""
        if not isinstance(v, dict):
            return _wait_status(_int(v))
        if "number" in v and "status" not in v:
            return _wait_status(_int(v))
        status = {s.upper() for s in v.get("status", []) if isinstance(s, str)}
        sig_obj = v.get("signal")
        sig = _int(sig_obj.get("id")) if isinstance(sig_obj, dict) else None
        rc = _int(v.get("return_code"))
        if status & {"SIGNALED", "CORE_DUMPED"} or (sig not in (None, 0) and not status):
            return None, sig
        if status & {"PENDING", "INVALID"}:
            return None, None
        return rc, None

    def check_update(self, body: Mapping[str, Any]) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for r in body.get("results") or []:
            if isinstance(r, dict):
                code = _int(r.get("error_code")) or 0
                if code:
                    out.append((code, f"{_str(r.get('error'))} {_str(r.get('why'))}".strip()))
        return out


class V0041(V0040):
    """Slurm 24.05 to 25.11: the script moves into ``job.script``."""

    version = "v0.0.41"
    script_in_job = True


class V0042(V0041):
    """Slurm 24.11 to 26.05: the submit answer loses its ``result`` object (job_id stays at the top);
    "nothing changed since update_time" is a 200 with an empty ``jobs`` list, not a 304."""

    version = "v0.0.42"
    update_time_accepted = True


class V0043(V0042):
    version = "v0.0.43"


class V0044(V0043):
    version = "v0.0.44"


class V0045(V0044):
    """Slurm 26.05's newest: job records gain ten fields and lose ``power``; none read here changes."""

    version = "v0.0.45"


DIALECTS: dict[str, type[Dialect]] = {d.version: d for d in (V0038, V0040, V0041, V0042, V0043, V0044, V0045)}
PROBE_ORDER = tuple(sorted(DIALECTS, key=lambda v: int(v.rsplit(".", 1)[1]), reverse=True))
"""Newest first: a server that serves several versions gets the newest one the adapter speaks."""

_VERSION = re.compile(r"^v?0\.0\.(\d+)$")


def dialect_for(version: str) -> Dialect:
    """The dialect for an API version (``v0.0.38``, ``0.0.42``...)."""
    m = _VERSION.match(version.strip())
    if not m:
        raise ValueError(f"not a slurmrestd API version: {version!r} (expected e.g. v0.0.38)")
    cls = DIALECTS.get(f"v0.0.{int(m.group(1))}")
    if cls is None:
        raise ValueError(
            f"slurmrestd API {version} is not supported (supported: {', '.join(sorted(DIALECTS))})"
        )
    return cls()
