"""A real single-node Slurm + slurmrestd, brought up in a temporary directory: 22.05, 24.11 or 26.05.

22.05 is the host's (Debian 12) packages, installed by ``make slurm-deps``. 24.11 (Debian 13) and
26.05 (Debian unstable) need a newer libc, so they run from a chroot built once by
``hack/slurm-chroot.sh`` (``make slurm-chroots``) and cached outside the repo. Loopback is shared,
so the tests talk to every slurmrestd on 127.0.0.1. Each daemon of a chroot lab runs in a private
mount namespace of its own with /proc, /sys and /dev mounted into the chroot: the mounts vanish with
the daemon, and two labs of one chroot (each in its own ``/lab-*`` directory) never share one.

Each lab has its own ports (free ones, picked at start), munge socket and key, JWT key, every daemon
in the foreground and owned by this object, torn down by PID (jobs cancelled first), also on
failure and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from tests.support.controlplane import set_pdeathsig

REQUIRED_BINARIES = ("munged", "slurmctld", "slurmd", "slurmrestd", "scontrol", "sbatch", "squeue", "setpriv")
REST_USER = "slurmrest"
JOB_USER = "dispatch"
CHROOT_READY = ".dispatch-ready"
"""hack/slurm-chroot.sh writes this file last: a chroot without it is not finished."""


@dataclass(frozen=True, slots=True)
class Flavor:
    """One Slurm this lab can run."""

    version: str
    """The Slurm release, e.g. ``24.11``: the test id."""
    suite: str | None
    """The Debian suite of its chroot; None for the host's packages."""
    api_versions: tuple[str, ...]
    """The REST API versions its slurmrestd serves, oldest first (checked by the tests)."""
    rest_plugins: str
    """slurmrestd ``-s``: 22.05 names its one version; later releases load every slurmctld parser."""
    none_plugins: bool
    """slurm.conf still accepts ``AccountingStorageType=accounting_storage/none`` and friends."""

    @property
    def newest_api(self) -> str:
        return self.api_versions[-1]


FLAVORS: dict[str, Flavor] = {
    "22.05": Flavor("22.05", None, ("v0.0.36", "v0.0.37", "v0.0.38"), "openapi/v0.0.38", True),
    "24.11": Flavor("24.11", "trixie", ("v0.0.40", "v0.0.41", "v0.0.42"), "openapi/slurmctld", False),
    "26.05": Flavor("26.05", "sid", ("v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"), "openapi/slurmctld", False),
}


def chroot_cache() -> Path:
    """Where hack/slurm-chroot.sh caches the chroots (one directory per suite)."""
    env = os.environ.get("DISPATCH_CHROOT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "dispatch" / "chroot"


def chroot_of(flavor: Flavor) -> Path | None:
    return None if flavor.suite is None else chroot_cache() / flavor.suite


def _in_main_thread() -> bool:
    return sys.platform == "linux" and threading.current_thread() is threading.main_thread()


class SlurmLabError(RuntimeError):
    """The lab could not be brought up (the message carries the daemons' log tails)."""


def missing_prerequisites(version: str = "22.05") -> list[str]:
    """What is missing to run the lab of Slurm ``version`` on this machine (empty when it can run)."""
    flavor = FLAVORS[version]
    root = chroot_of(flavor)
    if root is not None:
        missing = (
            []
            if (root / CHROOT_READY).exists()
            else [f"the {flavor.suite} chroot {root} (make slurm-chroots)"]
        )
        missing += [t for t in ("unshare", "chroot", "mount") if shutil.which(t) is None]
    else:
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

    ``version``: which Slurm (a key of :data:`FLAVORS`).
    ``min_job_age``: seconds a finished job stays visible (Slurm's MinJobAge).
    ``slurmd_timeout``: seconds before a silent slurmd is declared down.
    """

    def __init__(
        self,
        version: str = "22.05",
        *,
        root: Path | None = None,
        min_job_age: int = 300,
        slurmd_timeout: int = 10,
        return_to_service: int = 2,
        kill_wait: int = 2,
        token_lifespan: int = 86400,
    ) -> None:
        if version not in FLAVORS:
            raise ValueError(f"unknown Slurm version {version!r} (known: {', '.join(FLAVORS)})")
        self.flavor = FLAVORS[version]
        self.version = version
        self.chroot = chroot_of(self.flavor)
        self._given_root = root
        self.min_job_age = min_job_age
        self.slurmd_timeout = slurmd_timeout
        self.return_to_service = return_to_service
        self.kill_wait = kill_wait
        self.token_lifespan = token_lifespan
        self.root = Path()
        """The lab directory as this process sees it."""
        self.inner = Path()
        """The lab directory as the daemons and jobs see it (inside the chroot, if any)."""
        self.ctld_port = self.slurmd_port = self.rest_port = 0
        self.token = ""
        self.user_name = JOB_USER
        self.api_version = self.flavor.newest_api
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[object] = []
        self._started = False
        self._own_root = False

    def __repr__(self) -> str:
        return f"SlurmLab({self.version}, rest={self.url})"

    # ------------------------------------------------------------------ paths and env

    @property
    def conf(self) -> Path:
        """slurm.conf as this process sees it."""
        return self.root / "etc" / "slurm.conf"

    @property
    def inner_conf(self) -> Path:
        return self.inner / "etc" / "slurm.conf"

    @property
    def jobs_dir(self) -> Path:
        """World-writable directory for job working directories and output (as this process sees it)."""
        return self.root / "jobs"

    @property
    def inner_jobs_dir(self) -> Path:
        """The same directory as jobs see it: what a job's working directory must name."""
        return self.inner / "jobs"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for the Slurm CLI: this lab's config, and no SLURM_JWT (see notes §8.4)."""
        if self.chroot is not None:
            return {
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": "/root",
                "LANG": "C.UTF-8",
                "SLURM_CONF": str(self.inner_conf),
            }
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def backend_config(self, **extra: object) -> dict[str, object]:
        """A configuration mapping for ``dispatch._slurm.open_adapter``."""
        cfg: dict[str, object] = {
            "url": self.url,
            "user_name": self.user_name,
            "token": self.token,
            "working_directory": str(self.inner_jobs_dir),
        }
        cfg.update(extra)
        return cfg

    def _argv(self, argv: Sequence[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command line (and its environment) that runs ``argv`` as this lab's Slurm sees it.

        For a chroot lab: a private mount namespace with /proc, /sys and /dev mounted into the
        chroot, then ``chroot`` and ``env -i`` with exactly ``env``. Every step execs the next,
        so the PID of the process is the daemon's.
        """
        if self.chroot is None:
            return list(argv), env
        script = (
            'mount -t proc proc "$R/proc" && mount -t sysfs sysfs "$R/sys" && '
            'mount --rbind /dev "$R/dev" && exec chroot "$R" /usr/bin/env -i "$@"'
        )
        pairs = [f"{k}={v}" for k, v in env.items()]
        host_env = {"R": str(self.chroot), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            *pairs,
            *argv,
        ], host_env

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> SlurmLab:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        missing = missing_prerequisites(self.version)
        if missing:
            raise SlurmLabError(
                f"cannot start the Slurm {self.version} lab, missing: {', '.join(missing)} "
                "(run make slurm-deps slurm-chroots as root)"
            )
        atexit.register(self.stop)
        self._started = True
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        if self._given_root is not None:
            self.root = self._given_root
            self.root.mkdir(parents=True, exist_ok=True)
        elif self.chroot is not None:
            self.root = Path(tempfile.mkdtemp(prefix="lab-", dir=self.chroot))
            self._own_root = True
        else:
            self.root = Path(tempfile.mkdtemp(prefix="slurmlab-"))
            self._own_root = True
        self.inner = Path("/") / self.root.relative_to(self.chroot) if self.chroot is not None else self.root
        os.chmod(self.root, 0o755)
        for d in ("etc", "munge", "state", "spool/localhost", "log", "run"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.jobs_dir.mkdir(exist_ok=True)
        os.chmod(self.jobs_dir, 0o1777)
        munge_key = self.root / "munge" / "munge.key"
        munge_key.write_bytes(os.urandom(1024))
        os.chmod(munge_key, 0o400)
        # Open to all, as /run/munge on a real node: a job's srun authenticates through the socket
        # as the job's user (the key stays the owner's alone).
        os.chmod(self.root / "munge", 0o755)
        jwt_key = self.root / "etc" / "jwt_hs256.key"
        jwt_key.write_bytes(os.urandom(32))
        os.chmod(jwt_key, 0o600)
        self.ctld_port, self.slurmd_port, self.rest_port = _free_ports(3)
        self.conf.write_text(self._slurm_conf())
        if not self.flavor.none_plugins:
            (self.root / "etc" / "cgroup.conf").write_text("CgroupPlugin=disabled\n")

        i = self.inner
        sock = self.root / "munge" / "munge.socket.2"
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={i / 'munge' / 'munge.key'}",
                f"--socket={i / 'munge' / 'munge.socket.2'}",
                f"--pid-file={i / 'run' / 'munged.pid'}",
                f"--log-file={i / 'log' / 'munged.log'}",
                f"--seed-file={i / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(lambda: sock.exists(), 10, "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(self.inner_conf)])
        self._wait(lambda: self._cli_ok(["scontrol", "ping"], "UP"), 20, "slurmctld ping")
        self.start_slurmd()
        self.token = self.mint_token(self.user_name, self.token_lifespan)
        self.start_slurmrestd()

    def start_slurmd(self) -> None:
        self._spawn("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", str(self.inner_conf)])
        self._wait(self._node_ready, 30, "node idle")

    def start_slurmrestd(self) -> None:
        rest_env = self.env
        rest_env["SLURM_JWT"] = "daemon"  # required in jwt mode, else every request is refused
        self._spawn(
            "slurmrestd",
            [
                "setpriv",
                f"--reuid={REST_USER}",
                f"--regid={REST_USER}",
                "--init-groups",
                # The uid change clears the death signal set at fork: set it again, but only where
                # _spawn sets it (from the main thread: a worker thread that forked may exit first).
                *(["--pdeathsig=SIGKILL"] if _in_main_thread() else []),
                "slurmrestd",
                "-f",
                str(self.inner_conf),
                "-a",
                "rest_auth/jwt",
                "-s",
                self.flavor.rest_plugins,
                f"127.0.0.1:{self.rest_port}",
            ],
            env=rest_env,
        )
        self._wait(self._rest_ready, 20, "authenticated slurmrestd /ping")

    def ensure_daemons(self) -> None:
        """Start again slurmd and slurmrestd if a test killed them."""
        for name, start in (("slurmd", self.start_slurmd), ("slurmrestd", self.start_slurmrestd)):
            p = self._procs.get(name)
            if p is None or p.poll() is not None:
                self._procs.pop(name, None)
                start()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one daemon of the lab (``slurmrestd``, ``slurmd``...) by its PID and reap it."""
        p = self._procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
        p.wait(timeout=20)

    def _slurm_conf(self) -> str:
        r = self.inner
        none = (
            "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\nSwitchType=switch/none\n"
            if self.flavor.none_plugins
            else ""  # 24.11 dropped these "none" plugins: leaving the keys unset means none
        )
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
{none}MpiDefault=none
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
        log = open(self.root / "log" / f"{name}.stdout", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        cmd, environment = self._argv(argv, env if env is not None else self.env)
        # Die with the test process even when it is SIGKILLed (every step of the command line
        # execs the next, so the flag reaches the daemon); only from the main thread, where the
        # forking thread lives as long as the process.
        main = _in_main_thread()
        self._procs[name] = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=self.root,
            start_new_session=True,
            preexec_fn=set_pdeathsig if main else None,
        )

    def _wait(self, ok: object, timeout: float, what: str) -> None:
        assert callable(ok)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise SlurmLabError(
                        f"Slurm {self.version}: {name} exited with {p.returncode} while waiting for "
                        f"{what}:\n{self.log_tails()}"
                    )
            if ok():
                return
            time.sleep(0.05)
        raise SlurmLabError(
            f"Slurm {self.version}: timed out after {timeout} s waiting for {what}:\n{self.log_tails()}"
        )

    def _cli(self, argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        cmd, env = self._argv(argv, self.env)
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=timeout)

    def _cli_ok(self, argv: list[str], needle: str) -> bool:
        r = self._cli(argv, timeout=10)
        return r.returncode == 0 and needle in r.stdout

    def _node_ready(self) -> bool:
        r = self._cli(["sinfo", "-h", "-N", "-o", "%T"], timeout=10)
        return any(s.strip().rstrip("*") in ("idle", "mixed", "allocated") for s in r.stdout.split())

    def _rest_ready(self) -> bool:
        try:
            r = httpx.get(f"{self.url}/slurm/{self.api_version}/ping", headers=self.auth_headers(), timeout=2)
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
        spool = str(self.inner / "spool")
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
            if spool.encode() in environ or str(self.inner_conf).encode() in environ:
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
        r = self._cli(argv)
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

    def auth_headers(self, token: str | None = None) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": self.user_name, "X-SLURM-USER-TOKEN": token or self.token}

    def set_node_state(self, state: str, reason: str = "test") -> None:
        args = ["update", "nodename=localhost", f"state={state}"]
        if state.lower() not in ("resume", "idle", "undrain"):
            args.append(f"reason={reason}")
        r = self._cli(["scontrol", *args])
        # ReturnToService=2 may have brought the node back already: resuming an idle node is refused.
        if r.returncode != 0 and not (state.lower() == "resume" and "Invalid node state" in r.stderr):
            raise SlurmLabError(f"scontrol {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")

    def node_state(self) -> str:
        """The node's state as sinfo shows it (``idle``, ``down*``...): one line per partition, all alike."""
        lines = self.run("sinfo", "-h", "-N", "-o", "%T").split()
        return lines[0].strip() if lines else ""

    def job_ids(self) -> list[int]:
        return [int(x) for x in self.run("squeue", "-h", "-o", "%i").split() if x.strip().isdigit()]

    def job_state(self, job_id: int | str) -> dict[str, str]:
        """``scontrol show job`` as a flat dict (empty if Slurm no longer knows the job)."""
        r = self._cli(["scontrol", "-o", "show", "job", str(job_id)], timeout=10)
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
            f"--chdir={self.inner_jobs_dir}",
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
def slurm_lab(version: str = "22.05", **kwargs: int) -> Iterator[SlurmLab]:
    lab = SlurmLab(version, **kwargs)  # type: ignore[arg-type]
    with lab:
        yield lab
