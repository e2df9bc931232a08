"""Record what the real slurmrestd answers, for the recorded-response unit tests.

Starts the lab of each Slurm (tests/support/slurmlab.py), drives a fixed scenario through raw HTTP
(every job state the adapter classifies, the refusals, the authentication failures, each listing
call) and writes each exchange to ``tests/unit/data/slurm/<slurm>/<api>/<name>.json`` as
``{"request": ..., "status": ..., "body": ...}``, with an ``index.json`` naming the job ids. The lab's
directory is written as ``/lab``; the run fails if a token appears in anything it would write.

Usage (root, after ``make slurm-deps slurm-chroots``): ``make slurm-record`` or
``PYTHONPATH=. .venv/bin/python hack/slurm-record.py [22.05 24.11 26.05]`` (the labs run in parallel).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispatch._backends.slurm._dialects import PROBE_ORDER, SubmitRequest, dialect_for
from tests.support.slurmlab import FLAVORS, SlurmLab

OUT = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data" / "slurm"
GARBAGE = "eyJhbGciOiJIUzI1NiJ9.Z2FyYmFnZQ.bm90LWEtc2lnbmF0dXJl"
MISSING = 999999


class Recorder:
    def __init__(self, lab: SlurmLab) -> None:
        self.lab = lab
        self.dir = OUT / lab.version
        self.client = httpx.Client(base_url=lab.url, timeout=30)
        self.index: dict[str, Any] = {"slurm": lab.run("scontrol", "version").split()[-1], "jobs": {}}
        self.secrets = [lab.token]

    def normalize(self, text: str) -> str:
        for path in (str(self.lab.root), str(self.lab.inner)):
            text = text.replace(path, "/lab")
        return text

    def call(
        self,
        api: str,
        name: str | None,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        hdrs = self.lab.auth_headers() if headers is None else headers
        r = self.client.request(method, f"/slurm/{api}{path}", params=params, json=body, headers=hdrs)
        if name is not None:
            try:
                parsed: Any = r.json()
            except ValueError:
                parsed = {"__text__": r.text}
            rec = {
                "request": {"method": method, "path": f"/slurm/{api}{path}", "params": params, "body": body},
                "status": r.status_code,
                "body": parsed,
            }
            text = self.normalize(json.dumps(rec, indent=1, sort_keys=True))
            for s in self.secrets:
                if s and s in text:
                    raise SystemExit(f"{self.lab.version} {api} {name}: the token appears in the answer")
            target = self.dir / api / f"{name}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text + "\n")
        return r

    def submit(self, api: str, name: str | None, key: str, script: str, **kw: Any) -> int | None:
        d = dialect_for(api)
        req = SubmitRequest(
            script=f"#!/bin/bash\n{script}\n",
            name=f"dispatch-rec-{key}",
            comment=f"dispatch:job=rec-{key};submission=1",
            environment={"PATH": "/usr/bin:/bin"},
            **{
                "working_directory": str(self.lab.inner_jobs_dir),
                "standard_output": f"{self.lab.inner_jobs_dir}/rec-%j.out",
                **kw,
            },
        )
        r = self.call(api, name, "POST", "/job/submit", body=d.submit_body(req))
        job_id = d.parse_submit(r.json()) if r.status_code == 200 else None
        if job_id is not None:
            self.index["jobs"][key] = job_id
        return job_id

    def release(self, api: str, name: str | None, job_id: int) -> httpx.Response:
        return self.call(api, name, "POST", f"/job/{job_id}", body={"hold": False})

    def state(self, job_id: int) -> str:
        return self.lab.job_state(job_id).get("JobState", "")

    def wait(self, what: str, pred: Any, timeout: float = 60) -> None:
        self.lab.wait_for(pred, timeout, f"{self.lab.version}: {what}", interval=0.3)

    def run(self) -> None:
        lab, apis = self.lab, self.lab.flavor.api_versions
        served = [a for a in apis if a in ("v0.0.38",) or int(a.rsplit(".", 1)[1]) >= 40]
        new = served[-1]
        t0 = time.monotonic()
        # -- what the adapter's probe sees of a version the server does not serve
        for api in PROBE_ORDER:
            if api not in served:
                self.call(api, "licenses-not-served", "GET", "/licenses")
        # -- authentication, on every served version
        for api in served:
            self.call(api, "ping", "GET", "/ping")
            self.call(api, "ping-no-auth", "GET", "/ping", headers={})
            bad = {"X-SLURM-USER-NAME": lab.user_name, "X-SLURM-USER-TOKEN": GARBAGE}
            self.call(api, "ping-bad-token", "GET", "/ping", headers=bad)
            self.call(api, "licenses", "GET", "/licenses")
            self.call(api, "licenses-bad-token", "GET", "/licenses", headers=bad)
            self.call(api, "jobs-bad-token", "GET", "/jobs", headers=bad)
            both = {**lab.auth_headers(), "Authorization": f"Bearer {lab.token}"}
            self.call(api, "jobs-token-and-bearer", "GET", "/jobs", headers=both)
            bearer = {"X-SLURM-USER-NAME": lab.user_name, "Authorization": f"Bearer {lab.token}"}
            self.call(api, "licenses-bearer", "GET", "/licenses", headers=bearer)
            short = lab.mint_token(lab.user_name, 1)
            self.secrets.append(short)
            time.sleep(2.1)
            self.call(api, "jobs-expired-token", "GET", "/jobs", headers=lab.auth_headers(short))
            # -- a held submission, its record, the answers about a job that does not exist
            jid = self.submit(api, "submit-held", f"held-{api}", "true")
            assert jid is not None, f"{api}: held submit failed"
            self.call(api, "job-held", "GET", f"/job/{jid}")
            self.call(api, "job-missing", "GET", f"/job/{MISSING}")
            self.release(api, "update-missing", MISSING)
            self.call(api, "cancel-missing", "DELETE", f"/job/{MISSING}")
            self.submit(api, "submit-bad-partition", f"badpart-{api}", "true", partition="nosuch")
        # -- short jobs: success, non-zero exit, killed by a signal, a failed launch
        for key, script, kw in (
            ("ok", "echo hello; sleep 1", {}),
            ("nz", "exit 3", {}),
            ("sig", "kill -9 $$", {}),
            ("lf", "true", {"working_directory": "/nonexistent/dir"}),
        ):
            jid = self.submit(new, None, key, script, **kw)
            assert jid is not None
            self.release(new, "update-ok" if key == "ok" else None, jid)
        done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL")
        short = [self.index["jobs"][k] for k in ("ok", "nz", "sig", "lf")]
        self.wait("short jobs end", lambda: all(self.state(j) in done for j in short))
        self.call(new, "cancel-finished", "DELETE", f"/job/{self.index['jobs']['ok']}")
        # -- preemption: CANCEL mode and REQUEUE mode (submitted not requeueable)
        for key, part in (("pc", "lowcxl"), ("pr", "low")):
            jid = self.submit(new, None, key, "sleep 300", partition=part, cpus_per_task=1)
            assert jid is not None
            self.release(new, None, jid)
        pre = [self.index["jobs"][k] for k in ("pc", "pr")]
        self.wait("preemptable jobs run", lambda: all(self.state(j) == "RUNNING" for j in pre))
        self.call(new, "jobs-running", "GET", "/jobs")
        blocker = lab.submit_blocker("high", 2, 2)
        self.index["jobs"]["blocker"] = blocker
        self.wait("preemption", lambda: all(self.state(j) in done for j in pre))
        self.wait("blocker ends", lambda: self.state(blocker) in ("COMPLETED", ""))
        # -- jobs that can never fit: too many CPUs, too much memory, too many nodes
        for key, kw in (("fit-cpus", {"cpus_per_task": 64}), ("fit-mem", {"memory_per_node_mb": 100000})):
            jid = self.submit(new, f"submit-{key}", key, "true", **kw)
            if jid is not None:
                self.release(new, f"release-{key}", jid)
        self.submit(new, "submit-fit-nodes", "fit-nodes", "true", nodes=5)
        # -- cancels: a held job, and (v0.0.40+) two in one request
        jid = self.submit(new, None, "cancelled", "true")
        assert jid is not None
        self.call(new, "cancel-ok", "DELETE", f"/job/{jid}")
        if new != "v0.0.38":
            a = self.submit(new, None, "bulk-a", "true")
            b = self.submit(new, None, "bulk-b", "true")
            self.call(new, "bulk-cancel", "DELETE", "/jobs", body={"jobs": [str(a), str(b), str(MISSING)]})
        # -- a node set down under a running job
        jid = self.submit(new, None, "nodefail", "sleep 300", partition="high", cpus_per_task=1)
        assert jid is not None
        self.release(new, None, jid)
        self.wait("nodefail job runs", lambda: self.state(jid) == "RUNNING")
        lab.set_node_state("down", "recorder")
        self.wait("node failure", lambda: self.state(jid) in done)
        lab.set_node_state("resume")
        self.wait("node back", lambda: lab.node_state().rstrip("*") in ("idle", "mixed"))
        # -- a time limit (Slurm's smallest is a minute, checked about every 30 s)
        jid = self.submit(new, None, "tl", "sleep 300", partition="high", time_limit_minutes=1)
        assert jid is not None
        self.release(new, None, jid)
        self.wait("time limit", lambda: self.state(jid) in done, timeout=200)
        # -- the listings, on every served version
        ids = sorted(v for v in self.index["jobs"].values() if isinstance(v, int))
        for api in served:
            r = self.call(api, "jobs", "GET", "/jobs")
            last = r.json().get("last_update")
            self.index.setdefault("last_update", {})[api] = last
            now = int(time.time())
            self.call(api, "jobs-since-future", "GET", "/jobs", params={"update_time": now + 3600})
            self.call(api, "jobs-since-minute", "GET", "/jobs", params={"update_time": now - 60})
            if api != "v0.0.38":
                self.call(api, "jobs-state", "GET", "/jobs/state/")
                csv = ",".join(str(i) for i in [*ids[:3], MISSING])
                self.call(api, "jobs-state-some", "GET", "/jobs/state/", params={"job_id": csv})
            self.call(api, "job-completed", "GET", f"/job/{self.index['jobs']['ok']}")
        (self.dir / "index.json").write_text(json.dumps(self.index, indent=1, sort_keys=True) + "\n")
        print(f"{lab.version}: recorded in {time.monotonic() - t0:.0f} s into {self.dir}", flush=True)


def record(version: str) -> None:
    target = OUT / version
    if target.exists():
        shutil.rmtree(target)
    with SlurmLab(version, min_job_age=600, slurmd_timeout=10, kill_wait=2) as lab:
        Recorder(lab).run()


def main(argv: list[str]) -> int:
    versions = argv or list(FLAVORS)
    if len(versions) == 1:
        record(versions[0])
        return 0
    procs = [subprocess.Popen([sys.executable, __file__, v]) for v in versions]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
