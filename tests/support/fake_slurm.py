"""A fake slurmrestd (an ``httpx.MockTransport`` handler) serving N dispatch jobs with Slurm
22.05's ``update_time`` rule, for the polling tests and the polling bench.

Its job records are copies of one recorded from the real 22.05 (a running job of
``tests/unit/data/slurm/22.05/v0.0.38/jobs-running.json``) with the id, name and comment changed.
"""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

RECORDED = json.loads(
    (
        Path(__file__).resolve().parents[1]
        / "unit"
        / "data"
        / "slurm"
        / "22.05"
        / "v0.0.38"
        / "jobs-running.json"
    ).read_text()
)["body"]["jobs"]
RUNNING: dict[str, Any] = next(j for j in RECORDED if j["job_state"] == "RUNNING")
DONE: dict[str, Any] = next(j for j in RECORDED if j["job_state"] == "COMPLETED")


class FakeSlurm:
    """Just enough of slurmrestd v0.0.38: GET /jobs with update_time, one running job per dispatch job."""

    def __init__(self, n: int, foreign: int = 0) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}
        for i in range(n):
            self.jobs[i + 1] = self._record(i + 1, f"j{i}", "RUNNING")
        for k in range(foreign):  # other users' jobs, not dispatch's
            jid = 100000 + k
            self.jobs[jid] = {**copy.deepcopy(RUNNING), "job_id": jid, "comment": "", "user_name": "alice"}
        self.last_update = int(time.time()) - 10  # nothing changed lately: steady state
        self.paths: Counter[str] = Counter()
        self.not_modified = 0

    @staticmethod
    def _record(jid: int, job: str, state: str) -> dict[str, Any]:
        template = RUNNING if state == "RUNNING" else DONE
        return {
            **copy.deepcopy(template),
            "job_id": jid,
            "name": f"dispatch-{job}-1",
            "comment": f"dispatch:job={job};submission=1",
            "user_name": "dispatch",
        }

    def finish(self, index: int) -> None:
        self.jobs[index + 1] = self._record(index + 1, f"j{index}", "COMPLETED")
        self.last_update = int(time.time())

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths[f"{request.method} {request.url.path}"] += 1
        if request.url.path != "/slurm/v0.0.38/jobs":
            return httpx.Response(404, text="not found")
        since = request.url.params.get("update_time")
        if since is not None and int(since) - 1 >= self.last_update:
            self.not_modified += 1
            return httpx.Response(304)
        return httpx.Response(200, json={"meta": {}, "errors": [], "jobs": list(self.jobs.values())})

    @property
    def gets(self) -> int:
        return self.paths["GET /slurm/v0.0.38/jobs"]
