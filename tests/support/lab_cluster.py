"""The lab itself (:class:`Lab`): starting and stopping its processes (the control plane, kwok,
the training operator and the extras, with the Trainer's machine-global cert dir) and reading its
audit log. API access comes from :class:`~tests.support.lab_api.LabApi` and the failures from
:class:`~tests.support.lab_failures.LabFailures`; see :mod:`tests.support.lab` for the whole lab.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.support.controlplane import (
    ControlPlane,
    _cert_pem,
    _ExitedEarly,
    _free_port,
    _issue,
    _key_pem,
    _load_ca,
    _pid_alive,
    _pid_runs,
    _write,
    resolve_binaries,
)
from tests.support.lab_failures import LabFailures
from tests.support.lab_setup import (
    APISERVER_TOLERATION_FLAGS,
    AUDIT_POLICY,
    HIGH_PRIORITY,
    JOBSET_WEBHOOKS,
    KCM_NODE_FLAGS,
    KUEUE_CONVERSION_CRDS,
    KUEUE_FRAMEWORKS,
    KUEUE_NAMESPACE,
    KUEUE_SECRET,
    KWOK_CONFIG,
    LOW_PRIORITY,
    TRAINER_CERT_DIR,
    TRAINER_NAMESPACE,
    TRAINER_WEBHOOKS,
    TRAINING_OPERATOR_NAMESPACE,
    TRAINING_OPERATOR_SA,
    WEBHOOK_NAME,
    WRITE_VERBS,
    ApiStatus,
    LabBinaries,
    LabError,
    expand_extras,
    kueue_config,
    node_manifest,
    pytorch_init_container_flags,
    resolve_lab_binaries,
    wait_established,
)


class Lab(LabFailures):
    """The whole lab. ``start()``/``stop()`` or a context manager; see the module docstring."""

    def __init__(
        self,
        workdir: Path | str,
        *,
        nodes: int = 3,
        start_timeout: float = 120.0,
        training_operator: bool = True,
        extras: Sequence[str] = (),
        apiserver_args: Sequence[str] = (),
        service_accounts: bool = False,
    ) -> None:
        self.dir = Path(workdir).resolve()
        self.start_timeout = start_timeout
        self.with_training_operator = training_operator
        self.extras = expand_extras(extras)
        self.extras_seconds: dict[str, float] = {}
        self._trainer_lock: Any = None
        self.audit_log = self.dir / "audit.log"
        self.cp = ControlPlane(
            self.dir,
            start_timeout=start_timeout,
            extra_apiserver_args=[
                f"--audit-policy-file={self.dir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=1024",
                "--audit-log-format=json",
                *APISERVER_TOLERATION_FLAGS,
                *apiserver_args,
            ],
            service_accounts=service_accounts,
        )
        self.bins: LabBinaries | None = None
        self.start_seconds = 0.0
        self.ports: dict[str, int] = {}
        self._to_kubeconfig: Path | None = None
        super().__init__(self.cp, nodes)

    # ---- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Lab:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def control_plane(self) -> ControlPlane:
        return self.cp

    def start(self, *, detach: bool = False) -> None:
        """Start everything and wait until each part is ready (nodes Ready, webhook serving)."""
        t0 = time.monotonic()
        self.bins = resolve_lab_binaries(training_operator=self.with_training_operator, extras=self.extras)
        self.cp.binaries = self.cp.binaries or resolve_binaries()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        self.audit_log.unlink(missing_ok=True)
        try:
            self.cp.start(detach=detach)
            self._start_components(detach=detach)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        self._write_lab_state()

    def stop(self) -> None:
        """Stop every process (components first, then the apiserver and etcd) by PID."""
        try:
            self.cp.stop()
        finally:
            self._release_trainer_cert_dir()

    def _start_components(self, *, detach: bool) -> None:
        assert self.bins is not None
        cp = self.cp
        deadline = time.monotonic() + self.start_timeout
        sched_port, kcm_port = _free_port(), _free_port()
        self.ports.update(kube_scheduler=sched_port, kube_controller_manager=kcm_port)
        sched_kubeconfig = cp.mint_user("system:kube-scheduler")
        kcm_kubeconfig = cp.mint_user("system:kube-controller-manager")

        def scheduler_args(port: int) -> list[str]:
            return [
                f"--kubeconfig={sched_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'kube-scheduler'}",
                "--leader-elect=false",
            ]

        def kcm_args(port: int) -> list[str]:
            return [
                f"--kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'kube-controller-manager'}",
                "--leader-elect=false",
                # Each controller under its own ServiceAccount and bootstrap role, as in a cluster.
                "--use-service-account-credentials=true",
                "--controllers=*",
                f"--service-account-private-key-file={cp.pki / 'sa.key'}",
                f"--root-ca-file={cp.pki / 'server-ca.crt'}",
                *KCM_NODE_FLAGS,
            ]

        scheduler = cp.spawn(
            "kube-scheduler", self.bins.kube_scheduler, scheduler_args(sched_port), detach=detach
        )
        kcm = cp.spawn(
            "kube-controller-manager", self.bins.kube_controller_manager, kcm_args(kcm_port), detach=detach
        )
        kwok = cp.spawn(
            "kwok",
            self.bins.kwok,
            [
                f"--kubeconfig={cp.mint_user('kwok-controller', ['system:masters'])}",
                f"--config={KWOK_CONFIG}",
            ],
            detach=detach,
        )
        self.kubectl("create", "-f", "-", input=self._bootstrap_manifests())
        self._wait_or_respawn(scheduler, "kube_scheduler", scheduler_args, detach=detach)
        self._wait_or_respawn(kcm, "kube_controller_manager", kcm_args, detach=detach)
        if self.with_training_operator:
            self.start_training_operator(detach=detach)
        self.start_extras(self.extras, detach=detach)
        while True:
            ready = self.ready_nodes()
            if all(n in ready for n in self.nodes):
                break
            if kwok.popen is not None and kwok.popen.poll() is not None:
                raise LabError(f"kwok exited; log {kwok.log}")
            if time.monotonic() > deadline:
                raise LabError(f"kwok nodes not Ready ({sorted(ready)}); log {kwok.log}")
            time.sleep(0.2)

    def _wait_or_respawn(
        self, proc: Any, port_key: str, make_args: Any, *, detach: bool, attempts: int = 3
    ) -> None:
        """Wait for /healthz; a daemon that exits at start (its free port was taken meanwhile by
        another process on the machine) is started again on a new port."""
        for attempt in range(1, attempts + 1):
            try:
                self.cp.wait_http(proc, f"https://127.0.0.1:{self.ports[port_key]}/healthz")
                return
            except _ExitedEarly:
                if attempt == attempts:
                    raise
            self.cp._procs.remove(proc)
            self.ports[port_key] = _free_port()
            proc = self.cp.spawn(proc.name, proc.binary, make_args(self.ports[port_key]), detach=detach)

    def _bootstrap_manifests(self) -> str:
        """Nodes, PriorityClasses and the training operator's upstream objects, in one create."""
        assert self.bins is not None
        docs: list[dict[str, Any]] = [node_manifest(n) for n in self.nodes]
        docs += [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
                "description": "the test lab: preemption by kube-scheduler",
            }
            for name, value in ((HIGH_PRIORITY, 1000000), (LOW_PRIORITY, 100))
        ]
        if self.with_training_operator:
            m = self.bins.training_operator_manifests
            crd = yaml.safe_load((m / "kubeflow.org_pytorchjobs.yaml").read_text())
            role = yaml.safe_load((m / "role.yaml").read_text())
            sa = yaml.safe_load((m / "service-account.yaml").read_text())
            sa["metadata"]["namespace"] = TRAINING_OPERATOR_NAMESPACE
            docs += [
                crd,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINING_OPERATOR_NAMESPACE}},
                # As manifests/overlays/standalone's secretGenerator: the cert rotator fills it.
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": "training-operator-webhook-cert",
                        "namespace": TRAINING_OPERATOR_NAMESPACE,
                    },
                },
                role,
                sa,
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "training-operator"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": role["metadata"]["name"],
                    },
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "name": TRAINING_OPERATOR_SA,
                            "namespace": TRAINING_OPERATOR_NAMESPACE,
                        }
                    ],
                },
                self._webhook_configuration(m),
            ]
        return yaml.safe_dump_all(docs, sort_keys=False)

    def _webhook_configuration(self, manifests: Path) -> dict[str, Any]:
        """Upstream's pytorchjob entry of manifests/base/webhook/manifests.yaml, with a URL on
        loopback instead of the Service (no Service DNS here); the rotator injects the CA."""
        port = self.ports.setdefault("training_operator_webhook", _free_port())
        upstream = yaml.safe_load((manifests / "manifests.yaml").read_text())
        entry = next(w for w in upstream["webhooks"] if "pytorchjob" in w["name"])
        path = entry["clientConfig"]["service"]["path"]
        entry["clientConfig"] = {"url": f"https://localhost:{port}{path}"}
        entry["failurePolicy"] = "Fail"
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_NAME},
            "webhooks": [entry],
        }

    # ---- the training operator -----------------------------------------------------

    def start_training_operator(self, *, detach: bool = False) -> None:
        """Start (or restart) the training operator and wait for /readyz (certs and webhook up)."""
        assert self.bins is not None
        if self.training_operator_running():
            return
        if self._to_kubeconfig is None:
            self._to_kubeconfig = self.cp.serviceaccount_kubeconfig(
                TRAINING_OPERATOR_NAMESPACE, TRAINING_OPERATOR_SA
            )
        for attempt in range(1, 4):
            webhook = self.ports.setdefault("training_operator_webhook", _free_port())
            probe, metrics = _free_port(), _free_port()
            self.ports.update(training_operator_probe=probe, training_operator_metrics=metrics)
            self.cp._procs = [p for p in self.cp._procs if p.name != "training-operator"]
            proc = self.cp.spawn(
                "training-operator",
                self.bins.training_operator,
                [
                    "--enable-scheme=pytorchjob",
                    f"--metrics-bind-address=127.0.0.1:{metrics}",
                    f"--health-probe-bind-address=127.0.0.1:{probe}",
                    "--webhook-host=127.0.0.1",
                    f"--webhook-server-port={webhook}",
                    f"--webhook-cert-dir={self.dir / 'training-operator' / 'certs'}",
                    *pytorch_init_container_flags(self.dir / "training-operator"),
                ],
                detach=detach,
                env={"MY_POD_NAMESPACE": TRAINING_OPERATOR_NAMESPACE, "KUBECONFIG": str(self._to_kubeconfig)},
            )
            try:
                self.cp.wait_http(proc, f"http://127.0.0.1:{probe}/readyz")
                return
            except _ExitedEarly:  # one of its free ports was taken meanwhile: new ports, new URL
                if attempt == 3:
                    raise
            del self.ports["training_operator_webhook"]
            vwc = self._webhook_configuration(self.bins.training_operator_manifests)
            self.request(
                "PATCH",
                f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{WEBHOOK_NAME}",
                {"webhooks": vwc["webhooks"]},
                content_type="application/merge-patch+json",
            )

    def _training_operator_proc(self) -> Any:
        return next((p for p in self.cp._procs if p.name == "training-operator"), None)

    def training_operator_running(self) -> bool:
        proc = self._training_operator_proc()
        if proc is None:
            return False
        if proc.popen is not None:
            return bool(proc.popen.poll() is None)
        return _pid_runs(proc.pid, proc.binary)

    def stop_training_operator(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) the training operator and wait for it to exit."""
        import signal

        proc = self._training_operator_proc()
        if proc is None or not self.training_operator_running():
            return
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self.training_operator_running():
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    # ---- the extras: JobSet and Kubeflow Trainer v2 ----------------------------------

    def start_extras(self, names: Sequence[str], *, detach: bool = False) -> None:
        """Start the extras not yet running (``jobset``, ``trainer``; trainer implies jobset) and
        wait until each serves its webhooks; callable on a running lab (the ``lab_extras``
        fixture). Their start-up seconds go to ``extras_seconds`` and the state file."""
        wanted = expand_extras(names)
        if not wanted:
            return
        assert self.bins is not None
        if any(not getattr(self.bins, e) for e in wanted):
            self.bins = resolve_lab_binaries(
                training_operator=self.with_training_operator, extras=(*self.extras, *wanted)
            )
        started: list[str] = []
        for extra in wanted:
            if self._extra_running(extra):
                continue
            t0 = time.monotonic()
            if extra == "jobset":
                self._start_jobset(detach=detach)
            elif extra == "trainer":
                self._start_trainer(detach=detach)
            else:
                self._start_kueue(detach=detach)
            started.append(extra)
            self.extras_seconds[extra] = round(time.monotonic() - t0, 2)
        if "kueue" not in started and self._extra_running("kueue") and set(started) & set(KUEUE_FRAMEWORKS):
            # Kueue sets up a framework whose CRD came later only after a backoff of minutes.
            self.restart_kueue(detach=detach)
        self.extras = expand_extras((*self.extras, *wanted))
        if self.cp.state_file.exists():
            self._write_lab_state()

    def _extra_running(self, name: str) -> bool:
        proc = next((p for p in self.cp._procs if p.name == name), None)
        if proc is None:
            return False
        if proc.popen is not None:
            return bool(proc.popen.poll() is None)
        return _pid_runs(proc.pid, proc.binary)

    def _serving_cert(self, directory: Path) -> tuple[Path, str]:
        """tls.crt/tls.key for ``localhost`` and 127.0.0.1 from the lab's server CA (the one the
        apiserver's webhook calls verify against, as caBundle); returns the dir and the bundle."""
        ca_key, ca_cert = _load_ca(self.cp.pki, "server-ca")
        key, cert = _issue(
            ca_key,
            ca_cert,
            common_name="lab-webhook",
            server=True,
            dns_names=["localhost"],
            ips=["127.0.0.1"],
        )
        directory.mkdir(parents=True, exist_ok=True)
        _write(directory / "tls.crt", _cert_pem(cert), 0o644)
        _write(directory / "tls.key", _key_pem(key))
        return directory, base64.b64encode((self.cp.pki / "server-ca.crt").read_bytes()).decode()

    def _webhooks_on_loopback(
        self, manifest: Path, names: Sequence[str], port: int, ca_bundle: str, resources: set[str]
    ) -> list[dict[str, Any]]:
        """Upstream's webhook configurations with a loopback URL instead of the Service (no
        Service DNS here), keeping only the webhooks for RESOURCES (JobSet's pod webhooks would
        apply to every pod in the lab), renamed NAMES (mutating, validating)."""
        out: list[dict[str, Any]] = []
        for doc in yaml.safe_load_all(manifest.read_text()):
            if not doc:
                continue
            hooks = []
            for hook in doc.get("webhooks") or ():
                if (
                    not {r for rule in hook.get("rules") or () for r in rule.get("resources") or ()}
                    & resources
                ):
                    continue
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://localhost:{port}{path}", "caBundle": ca_bundle}
                hooks.append(hook)
            name = names[0] if doc["kind"] == "MutatingWebhookConfiguration" else names[1]
            out.append(
                {
                    "apiVersion": doc["apiVersion"],
                    "kind": doc["kind"],
                    "metadata": {"name": name},
                    "webhooks": hooks,
                }
            )
        return out

    def _spawn_ready(
        self, name: str, binary: str, make_args: Any, *, detach: bool, env: dict[str, str] | None = None
    ) -> dict[str, int]:
        """Spawn a controller-runtime manager on fresh loopback ports (probe, metrics, webhook)
        and wait for /readyz; a port taken meanwhile by another process means new ports."""
        for attempt in range(1, 4):
            ports = {"probe": _free_port(), "metrics": _free_port(), "webhook": _free_port()}
            self.cp._procs = [p for p in self.cp._procs if p.name != name]
            user = self.cp.mint_user(f"lab-{name}", ["system:masters"])
            proc = self.cp.spawn(name, binary, make_args(ports, user), detach=detach, env=env)
            try:
                self.cp.wait_http(proc, f"http://127.0.0.1:{ports['probe']}/readyz")
            except _ExitedEarly:
                if attempt == 3:
                    raise
                continue
            self.ports.update({f"{name}_{k}": v for k, v in ports.items()})
            return ports
        raise AssertionError("unreachable")

    def _start_jobset(self, *, detach: bool) -> None:
        assert self.bins is not None
        m = self.bins.jobset_manifests
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(m / "jobset.x-k8s.io_jobsets.yaml")
        )
        self._wait_established("jobsets")
        certs, ca_bundle = self._serving_cert(self.dir / "jobset" / "certs")
        config = self.dir / "jobset" / "config.yaml"

        def args(ports: dict[str, int], user: Path) -> list[str]:
            # internalCertManagement off: its cert dir would be the machine-global one; certDir is ours.
            config.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                        "kind": "Configuration",
                        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['probe']}"},
                        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
                        "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(certs)},
                        "leaderElection": {"leaderElect": False},
                        "internalCertManagement": {"enable": False},
                    }
                )
            )
            return [
                f"--kubeconfig={user}",
                f"--config={config}",
                f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
            ]

        ports = self._spawn_ready("jobset", self.bins.jobset, args, detach=detach)
        # Without the mutating webhook's defaults (spec.network) the reconciler panics on every
        # JobSet (dnsHostnamesEnabled, pkg/controllers/jobset_controller.go).
        hooks = self._webhooks_on_loopback(
            m / "webhook-manifests.yaml", JOBSET_WEBHOOKS, ports["webhook"], ca_bundle, {"jobsets"}
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks, sort_keys=False))

    def _wait_established(self, *plurals: str) -> None:
        group = {"jobsets": "jobset.x-k8s.io"}
        names = (p if "." in p else f"{p}.{group.get(p, 'trainer.kubeflow.org')}" for p in plurals)
        wait_established(self.kubectl, names)

    def _start_trainer(self, *, detach: bool) -> None:
        assert self.bins is not None
        m = self.bins.trainer_manifests
        for crd in sorted(m.glob("trainer.kubeflow.org_*.yaml")):
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        # It exits at start when a kind is not served yet ("no matches for kind TrainJob").
        self._wait_established("trainjobs", "trainingruntimes", "clustertrainingruntimes")
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINER_NAMESPACE}}
            ),
        )
        self._take_trainer_cert_dir()
        _, ca_bundle = self._serving_cert(TRAINER_CERT_DIR)
        config = self.dir / "trainer" / "config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)

        def args(ports: dict[str, int], user: Path) -> list[str]:
            # certManagement off: the serving cert is the lab CA's, in the hard-coded dir.
            config.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                        "kind": "Configuration",
                        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['probe']}"},
                        "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}", "secureServing": True},
                        "webhook": {"port": ports["webhook"], "host": "127.0.0.1"},
                        "leaderElection": {"leaderElect": False},
                        "certManagement": {"enable": False},
                    }
                )
            )
            return [f"--kubeconfig={user}", f"--config={config}"]

        ports = self._spawn_ready("trainer", self.bins.trainer, args, detach=detach)
        self._note_trainer_pid()
        hooks = self._webhooks_on_loopback(
            m / "webhook-manifests.yaml",
            TRAINER_WEBHOOKS,
            ports["webhook"],
            ca_bundle,
            {"trainjobs", "trainingruntimes", "clustertrainingruntimes"},
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks, sort_keys=False))
        # Through the validating webhook just registered (the apiserver may still miss it).
        deadline = time.monotonic() + 60
        while True:
            try:
                self.kubectl("apply", "-f", str(m / "torch_distributed.yaml"))
                return
            except LabError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _kueue_frameworks(self) -> list[str]:
        running = {"pytorchjob"} if self.with_training_operator else set()
        running |= {e for e in ("jobset", "trainer") if self._extra_running(e)}
        return [fw for key, fw in KUEUE_FRAMEWORKS.items() if key in running]

    def _start_kueue(self, *, detach: bool) -> None:
        assert self.bins is not None
        m = self.bins.kueue_manifests
        for crd in sorted(m.glob("kueue.x-k8s.io_*.yaml")):
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self._wait_established(*(f"{c}.kueue.x-k8s.io" for c in KUEUE_CONVERSION_CRDS))
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump_all(
                [
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {"name": KUEUE_SECRET, "namespace": KUEUE_NAMESPACE},
                    },
                ]
            ),
        )
        self._start_kueue_process(detach=detach)

    def _start_kueue_process(self, *, detach: bool) -> None:
        assert self.bins is not None
        certs = self.dir / "kueue" / "certs"
        config = self.dir / "kueue" / "config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        frameworks = self._kueue_frameworks()

        def args(ports: dict[str, int], user: Path) -> list[str]:
            for crd in KUEUE_CONVERSION_CRDS:
                conversion = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"https://localhost:{ports['webhook']}/convert"},
                        "conversionReviewVersions": ["v1"],
                    },
                }
                self.request(
                    "PATCH",
                    f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}.kueue.x-k8s.io",
                    {"spec": {"conversion": conversion}},
                    content_type="application/merge-patch+json",
                )
            body = kueue_config(ports=ports, cert_dir=certs, frameworks=frameworks)
            config.write_text(yaml.safe_dump(body))
            # --kubeconfig as a flag: the visibility server reads the flag, not $KUBECONFIG. That
            # server is off: it writes self-signed certs to a hard-coded /visibility at the
            # filesystem root (pkg/visibility/server.go), and the lab writes nothing outside its dir.
            return [f"--kubeconfig={user}", f"--config={config}", "--feature-gates=VisibilityOnDemand=false"]

        stop = threading.Event()
        copier = threading.Thread(target=self._copy_kueue_certs, args=(certs, stop), daemon=True)
        copier.start()
        try:
            self._spawn_ready(
                "kueue", self.bins.kueue, args, detach=detach, env={"POD_NAMESPACE": KUEUE_NAMESPACE}
            )
        finally:
            stop.set()
            copier.join(timeout=10)

    def _copy_kueue_certs(self, certs: Path, stop: threading.Event) -> None:
        """Copy the rotator's Secret into the cert dir once it is filled (its kubelet volume). Once
        is enough: the rotator only waits for the files, and it renews years later."""
        path = f"/api/v1/namespaces/{KUEUE_NAMESPACE}/secrets/{KUEUE_SECRET}"
        while not stop.is_set():
            try:
                data = self.request("GET", path).get("data") or {}
            except (ApiStatus, OSError):
                data = {}
            if all(data.get(k) for k in ("tls.crt", "tls.key", "ca.crt")):
                certs.mkdir(parents=True, exist_ok=True)
                for name, value in data.items():
                    _write(certs / name, base64.b64decode(value), 0o600 if name.endswith(".key") else 0o644)
                return
            stop.wait(0.2)

    def kueue_running(self) -> bool:
        return self._extra_running("kueue")

    def stop_kueue(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) Kueue and wait for it to exit."""
        import signal

        proc = next((p for p in self.cp._procs if p.name == "kueue"), None)
        if proc is None or not self.kueue_running():
            return
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self.kueue_running():
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
            time.sleep(0.05)

    def restart_kueue(self, *, detach: bool = False) -> None:
        """Stop Kueue and start it again (frameworks recomputed from what runs now)."""
        self.stop_kueue()
        t0 = time.monotonic()
        self._start_kueue_process(detach=detach)
        self.extras_seconds["kueue"] = round(time.monotonic() - t0, 2)

    # The machine-global cert dir: mkdir of its parent is the mutex; owner.json names the holder
    # (its lab dir and the pids that keep it: this process until the Trainer runs, then the Trainer).

    def _owner_file(self) -> Path:
        return TRAINER_CERT_DIR.parent / "owner.json"

    def _take_trainer_cert_dir(self) -> None:
        root = TRAINER_CERT_DIR.parent
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                root.mkdir()
                break
            except FileExistsError:
                holder = cert_dir_holder(self._owner_file())
                if holder is None:  # stale: its holder is gone
                    shutil.rmtree(root, ignore_errors=True)
                    continue
                if holder == str(self.dir):
                    shutil.rmtree(TRAINER_CERT_DIR, ignore_errors=True)
                    break
                if time.monotonic() > deadline:
                    raise LabError(
                        f"{TRAINER_CERT_DIR} is held by the lab in {holder} (Trainer v2's hard-coded "
                        "cert dir: one Trainer per machine); stop that lab first"
                    ) from None
                time.sleep(1.0)
        self._write_owner([{"pid": os.getpid(), "binary": ""}])

    def _note_trainer_pid(self) -> None:
        proc = next(p for p in self.cp._procs if p.name == "trainer")
        self._write_owner([{"pid": proc.pid, "binary": proc.binary}])

    def _write_owner(self, pids: list[dict[str, Any]]) -> None:
        tmp = self._owner_file().with_suffix(".tmp")
        tmp.write_text(json.dumps({"lab": str(self.dir), "pids": pids}))
        tmp.replace(self._owner_file())

    def _release_trainer_cert_dir(self) -> None:
        release_trainer_cert_dir(self.dir)

    # ---- the audit log -------------------------------------------------------------

    def audit_mark(self) -> int:
        """A position in the audit log: pass it as ``since`` to :meth:`audit_writes`."""
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def audit_writes(
        self,
        since: int = 0,
        *,
        user: str | None = None,
        namespace: str | None = None,
        resource: str | None = None,
    ) -> list[dict[str, Any]]:
        """The write requests (create/update/patch/delete) the apiserver audited after ``since``."""
        out: list[dict[str, Any]] = []
        with self.audit_log.open("rb") as f:
            f.seek(since)
            for line in f:
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if event.get("verb") not in WRITE_VERBS:
                    continue
                ref = event.get("objectRef") or {}
                if user is not None and (event.get("user") or {}).get("username") != user:
                    continue
                if namespace is not None and ref.get("namespace") != namespace:
                    continue
                if resource is not None and ref.get("resource") != resource:
                    continue
                out.append(event)
        return out

    def _write_lab_state(self) -> None:
        state_file = self.cp.state_file
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        state.update(
            lab_start_seconds=round(self.start_seconds, 2),
            ports=self.ports,
            nodes=self.nodes,
            audit_log=str(self.audit_log),
            extras=list(self.extras),
            extras_seconds=self.extras_seconds,
        )
        state_file.write_text(json.dumps(state, indent=2))


def cert_dir_holder(owner_file: Path) -> str | None:
    """The lab dir holding Trainer's global cert dir, or None when no recorded holder lives.
    A dir without owner.json yet is held (its creator is between mkdir and the write)."""
    try:
        owner = json.loads(owner_file.read_text())
    except FileNotFoundError:
        age = time.time() - owner_file.parent.stat().st_mtime
        return "(a lab starting)" if age < 10 else None
    except (OSError, ValueError):
        return None
    alive = any(
        _pid_runs(int(p["pid"]), str(p["binary"])) if p.get("binary") else _pid_alive(int(p["pid"]))
        for p in owner.get("pids") or ()
    )
    return str(owner.get("lab")) if alive else None


def release_trainer_cert_dir(lab_dir: Path | str) -> None:
    """Remove Trainer's global cert dir if the lab in LAB_DIR took it (``stop`` and ``down``)."""
    root = TRAINER_CERT_DIR.parent
    try:
        owner = json.loads((root / "owner.json").read_text())
    except (OSError, ValueError):
        return
    if owner.get("lab") == str(Path(lab_dir).resolve()):
        shutil.rmtree(root, ignore_errors=True)


__all__ = [
    "Lab",
    "cert_dir_holder",
    "release_trainer_cert_dir",
]
