"""A real single-node Slurm 22.05 + slurmrestd, brought up in a temporary directory.

Follows ``shared/notes/slurm-notes.md``: own ports (free ones, picked at start), own munge
socket and key, own JWT key, every daemon in the foreground and owned by this object, torn down
by PID (jobs cancelled first), also on failure and at interpreter exit.

Needs root and the Debian packages installed by ``make slurm-deps``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import httpx

REQUIRED_BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "scontrol", "sbatch", "squeue", "setpriv")
JWT_PLUGIN = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so")
REST_USER = "slurmrest"
JOB_USER = "dispatch"
API_VERSION = "v0.0.38"


class SlurmLabError(RuntimeError):
    """The lab could not be brought up (the message carries the daemons' log tails)."""


def missing_prerequisites() -> list[str]:
    """What is missing to run the lab on this machine (empty when it can run)."""
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None]
    jwt = list(Path("/usr/lib").glob("*/slurm-wlm/auth_jwt.so")) or list(
        Path("/usr/lib").glob("slurm*/auth_jwt.so")
    )
    if not jwt:
        missing.append("slurm-wlm-jwt-plugin (auth_jwt.so)")
    for user in (REST_USER, JOB_USER):
        if subprocess.run(["id", "-u", user], capture_output=True, check=False).returncode != 0:
            missing.append(f"user {user}")
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def _free_ports(n: int) -> list[int]:
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _is_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    for line in status.splitlines():
        if line.startswith("State:"):
            return "Z" in line.split(":", 1)[1].split()[0]
    return False


class SlurmLab:
    """One lab. Use as a context manager, or ``start()`` / ``stop()``.

    ``min_job_age``: seconds a finished job stays visible (Slurm's MinJobAge).
    ``slurmd_timeout``: seconds before a silent slurmd is declared down.
    """

    def __init__(
        self,
        *,
        root: Path | None = None,
        min_job_age: int = 300,
        slurmd_timeout: int = 10,
        return_to_service: int = 2,
        kill_wait: int = 2,
        token_lifespan: int = 86400,
    ) -> None:
        self._given_root = root
        self.min_job_age = min_job_age
        self.slurmd_timeout = slurmd_timeout
        self.return_to_service = return_to_service
        self.kill_wait = kill_wait
        self.token_lifespan = token_lifespan
        self.root = Path()
        self.ctld_port = self.slurmd_port = self.rest_port = 0
        self.token = ""
        self.user_name = JOB_USER
        self.api_version = API_VERSION
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[object] = []
        self._started = False
        self._own_root = False

    # ------------------------------------------------------------------ paths and env

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def jobs_dir(self) -> Path:
        """World-writable directory for job working directories and output."""
        return self.root / "jobs"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for the Slurm CLI: this lab's config, and no SLURM_JWT (see notes §8.4)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def backend_config(self, **extra: object) -> dict[str, object]:
        """A configuration mapping for ``dispatch._slurm.open_adapter``."""
        cfg: dict[str, object] = {
            "url": self.url,
            "user_name": self.user_name,
            "token": self.token,
            "working_directory": str(self.jobs_dir),
        }
        cfg.update(extra)
        return cfg

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> SlurmLab:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        missing = missing_prerequisites()
        if missing:
            raise SlurmLabError(
                f"cannot start the Slurm lab, missing: {', '.join(missing)} (run make slurm-deps)"
            )
        atexit.register(self.stop)
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        if self._given_root is None:
            self.root = Path(tempfile.mkdtemp(prefix="slurmlab-"))
            self._own_root = True
        else:
            self.root = self._given_root
            self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        for d in ("etc", "munge", "state", "spool/localhost", "log", "run"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.jobs_dir.mkdir(exist_ok=True)
        os.chmod(self.jobs_dir, 0o1777)
        munge_key = self.root / "munge" / "munge.key"
        munge_key.write_bytes(os.urandom(1024))
        os.chmod(munge_key, 0o400)
        os.chmod(self.root / "munge", 0o700)
        jwt_key = self.root / "etc" / "jwt_hs256.key"
        jwt_key.write_bytes(os.urandom(32))
        os.chmod(jwt_key, 0o600)
        self.ctld_port, self.slurmd_port, self.rest_port = _free_ports(3)
        self.conf.write_text(self._slurm_conf())

        sock = self.root / "munge" / "munge.socket.2"
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={munge_key}",
                f"--socket={sock}",
                f"--pid-file={self.root / 'run' / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(lambda: sock.exists(), 10, "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._cli_ok(["scontrol", "ping"], "UP"), 20, "slurmctld ping")
        self._spawn("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)])
        self._wait(self._node_ready, 30, "node idle")
        rest_env = self.env
        rest_env["SLURM_JWT"] = "daemon"
        self._spawn(
            "slurmrestd",
            [
                "setpriv",
                f"--reuid={REST_USER}",
                f"--regid={REST_USER}",
                "--init-groups",
                "slurmrestd",
                "-f",
                str(self.conf),
                "-a",
                "rest_auth/jwt",
                "-s",
                f"openapi/{API_VERSION}",
                f"127.0.0.1:{self.rest_port}",
            ],
            env=rest_env,
        )
        self.token = self.mint_token(self.user_name, self.token_lifespan)
        self._wait(self._rest_ready, 20, "authenticated slurmrestd /ping")

    def _slurm_conf(self) -> str:
        r = self.root
        return f"""\
ClusterName=lab
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket.2
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={r}/etc/jwt_hs256.key
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=2
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=200
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
ReturnToService={self.return_to_service}
KillWait={self.kill_wait}
MinJobAge={self.min_job_age}
InactiveLimit=0
SlurmdTimeout={self.slurmd_timeout}
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=low    Nodes=localhost Default=YES MaxTime=INFINITE State=UP PriorityTier=1  PreemptMode=REQUEUE
PartitionName=lowcxl Nodes=localhost Default=NO  MaxTime=INFINITE State=UP PriorityTier=1  PreemptMode=CANCEL
PartitionName=high   Nodes=localhost Default=NO  MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
"""

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        self._procs[name] = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env if env is not None else self.env,
            cwd=self.root,
            start_new_session=True,
        )

    def _wait(self, ok: object, timeout: float, what: str) -> None:
        assert callable(ok)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise SlurmLabError(
                        f"{name} exited with {p.returncode} while waiting for {what}:\n{self.log_tails()}"
                    )
            if ok():
                return
            time.sleep(0.05)
        raise SlurmLabError(f"timed out after {timeout} s waiting for {what}:\n{self.log_tails()}")

    def _cli_ok(self, argv: list[str], needle: str) -> bool:
        r = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False, timeout=10)
        return r.returncode == 0 and needle in r.stdout

    def _node_ready(self) -> bool:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        return any(s.strip().rstrip("*") in ("idle", "mixed", "allocated") for s in r.stdout.split())

    def _rest_ready(self) -> bool:
        try:
            r = httpx.get(f"{self.url}/slurm/{API_VERSION}/ping", headers=self.auth_headers(), timeout=2)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by PID (slurmrestd, slurmd, slurmctld, munged)."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        ctld = self._procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None and "slurmd" in self._procs:
            with contextlib.suppress(Exception):
                self.cancel_all_jobs(wait=10)
        for name in ("slurmrestd", "slurmd", "slurmctld", "munged"):
            p = self._procs.get(name)
            if p is None or p.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        self._kill_leftover_steps()
        self._procs.clear()
        for log in self._logs:
            with contextlib.suppress(Exception):
                log.close()  # type: ignore[attr-defined]
        self._logs.clear()
        if self._own_root and os.environ.get("SLURMLAB_KEEP") != "1":
            shutil.rmtree(self.root, ignore_errors=True)

    def _kill_leftover_steps(self) -> None:
        """slurmstepd processes of this lab that outlived slurmd (they reference our spool dir)."""
        spool = str(self.root / "spool")
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if not cmd.startswith("slurmstepd"):
                    continue
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if spool.encode() in environ or str(self.conf).encode() in environ:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    def log_tails(self, lines: int = 15) -> str:
        out: list[str] = []
        if not self.root or not (self.root / "log").exists():
            return ""
        for f in sorted((self.root / "log").iterdir()):
            with contextlib.suppress(OSError):
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                if tail:
                    out.append(f"--- {f.name}\n" + "\n".join(tail))
        return "\n".join(out)

    # ------------------------------------------------------------------ helpers

    def run(self, *argv: str, check: bool = True) -> str:
        r = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=False, timeout=30)
        if check and r.returncode != 0:
            raise SlurmLabError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args)

    def mint_token(self, user: str, lifespan: int = 86400) -> str:
        out = self.scontrol("token", f"username={user}", f"lifespan={lifespan}")
        for line in out.splitlines():
            if line.startswith("SLURM_JWT="):
                return line.split("=", 1)[1].strip()
        raise SlurmLabError("scontrol token printed no SLURM_JWT")

    def auth_headers(self) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": self.user_name, "X-SLURM-USER-TOKEN": self.token}

    def set_node_state(self, state: str, reason: str = "test") -> None:
        args = ["update", "nodename=localhost", f"state={state}"]
        if state.lower() not in ("resume", "idle", "undrain"):
            args.append(f"reason={reason}")
        self.scontrol(*args)

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-o", "%T").strip()

    def job_ids(self) -> list[int]:
        return [int(x) for x in self.run("squeue", "-h", "-o", "%i").split() if x.strip().isdigit()]

    def job_state(self, job_id: int | str) -> dict[str, str]:
        """``scontrol show job`` as a flat dict (empty if Slurm no longer knows the job)."""
        r = subprocess.run(
            ["scontrol", "-o", "show", "job", str(job_id)],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        out: dict[str, str] = {}
        for tok in r.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                out.setdefault(k, v)
        return out

    def submit_blocker(self, partition: str = "high", cpus: int = 2, seconds: int = 600) -> int:
        """Submit a whole-node job (as root, via sbatch) that preempts lower partitions."""
        out = self.run(
            "sbatch",
            "--parsable",
            f"--partition={partition}",
            f"--cpus-per-task={cpus}",
            f"--chdir={self.jobs_dir}",
            "--output=/dev/null",
            "--job-name=lab-blocker",
            f"--wrap=sleep {seconds}",
        )
        return int(out.strip().split(";")[0])

    def scancel(self, *job_ids: int | str) -> None:
        if job_ids:
            self.run("scancel", *(str(j) for j in job_ids), check=False)

    def cancel_all_jobs(self, wait: float = 10) -> None:
        ids = self.job_ids()
        if ids:
            self.scancel(*ids)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            states = self.run("squeue", "-h", "-o", "%t", check=False).split()
            if not any(s in ("R", "CG", "S", "CF", "SO") for s in states):
                return
            time.sleep(0.1)

    def wait_for(self, pred: object, timeout: float, what: str, interval: float = 0.2) -> None:
        assert callable(pred)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def slurm_lab(**kwargs: int) -> Iterator[SlurmLab]:
    lab = SlurmLab(**kwargs)  # type: ignore[arg-type]
    with lab:
        yield lab
