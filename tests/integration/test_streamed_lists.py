"""The kit's informers and the record store's shared watch list by a streamed list (KEP-3157's
``sendInitialEvents``: one watch response, every object as an event from the API server's watch
cache, then the bookmark that ends them) where the API server serves one, and by pages where it
refuses one. Both real: the lab's kube-apiserver v1.34, and one started here with the
WatchList feature gate off, which refuses a streamed list as invalid as any server without it does.
And such a watch goes on across a restart of the API server (a control plane's rolling upgrade).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch._controller.store import KubeRecordStore
from dispatch._kubeclient import Informer, KubeClient, new_client
from tests.integration.conftest import dispatch_job
from tests.support.controlplane import ControlPlane, resolve_binaries
from tests.support.kube import KubeCluster
from tests.support.lab_setup import wait_established

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LABEL = "streamed.dispatch.dev/test"
GUARD = 60.0


def configmap(name: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels:\n    {LABEL}: 'yes'\n"


def kubectl(kubectl_bin: str, kubeconfig: Path, *args: str, stdin: str | None = None) -> None:
    subprocess.run(
        [kubectl_bin, f"--kubeconfig={kubeconfig}", *args], input=stdin, text=True, check=True, timeout=60
    )


@pytest.fixture(scope="module")
def without_watch_list(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, str]]:
    """An API server with the WatchList feature gate off, the DispatchJob CRD installed."""
    binaries = resolve_binaries()
    cp = ControlPlane(
        tmp_path_factory.mktemp("no-watch-list"),
        binaries=binaries,
        extra_apiserver_args=["--feature-gates=WatchList=false"],
    )
    with cp:
        kubectl(binaries.kubectl, cp.kubeconfig, "apply", "-f", str(REPO / "crds"))

        def run(*args: str, check: bool = True) -> str:
            done = subprocess.run(
                [binaries.kubectl, f"--kubeconfig={cp.kubeconfig}", *args],
                capture_output=True,
                text=True,
                check=check,
                timeout=60,
            )
            return done.stdout

        # polled: `kubectl wait` fails at once on a CRD whose status has no conditions yet
        wait_established(run, ["dispatchjobs.dispatch.dev"])
        yield cp, binaries.kubectl


@contextlib.asynccontextmanager
async def client(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    api = await new_client(str(kubeconfig))
    async with api:
        yield api
    await asyncio.sleep(0.1)  # TLS transports close on the next turns of the loop


def configmap_informer(api: KubeClient, namespace: str, on_change: Any) -> Informer[Any]:
    """A shared watch of the namespace's labelled ConfigMaps."""
    return Informer(
        api,
        f"/api/v1/namespaces/{namespace}/configmaps",
        label_selector=LABEL,
        on_change=on_change,
        what="configmaps",
    )


async def informer_sees(api: KubeClient, namespace: str, add: Any) -> Informer[Any]:
    """An informer on the namespace's labelled ConfigMaps: synced with the two there, then told of
    a third made after."""
    seen: list[str] = []
    third = asyncio.Event()

    def changed(old: Any, new: Any) -> None:
        if new is not None:
            seen.append(new["metadata"]["name"])
            if new["metadata"]["name"] == "c":
                third.set()

    informer = configmap_informer(api, namespace, changed)
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(GUARD):
            await informer.synced.wait()
        assert sorted(informer.items) == [f"{namespace}/a", f"{namespace}/b"]
        await asyncio.to_thread(add, "c")
        async with asyncio.timeout(GUARD):
            await third.wait()
        assert sorted(seen) == ["a", "b", "c"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return informer


async def store_sees(api: KubeClient, namespace: str, add: Any) -> list[tuple[str, str]]:
    """The record store's shared DispatchJob watch: the two there, ``synced``, then a third made after."""
    said: list[tuple[str, str]] = []
    adding: list[asyncio.Task[None]] = []
    third = asyncio.Event()
    store = KubeRecordStore(api, namespaces=[namespace])

    def told(job: str, body: Any) -> None:
        said.append(("deleted" if body is None else "shown", job.partition("/")[2]))
        if job.endswith("-c"):
            third.set()

    def synced() -> None:  # the watch goes on reading: the third is made beside it
        said.append(("synced", ""))
        adding.append(asyncio.create_task(asyncio.to_thread(add, "c")))

    store.watch_all(told, synced)
    try:
        async with asyncio.timeout(GUARD):
            await third.wait()
    finally:
        await store.aclose()
        await asyncio.gather(*adding)
    return said


@pytest.mark.parametrize("gate", ["on", "off"])
async def test_lists_are_streamed_where_served_and_paged_where_refused(
    gate: str,
    crds: KubeCluster,
    namespace: str,
    without_watch_list: tuple[ControlPlane, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    if gate == "on":
        kubeconfig, kubectl_bin, ns = crds.kubeconfig, crds.kubectl_bin, namespace
    else:
        cp, kubectl_bin = without_watch_list
        kubeconfig, ns = cp.kubeconfig, "default"

    def add_configmap(name: str) -> None:
        kubectl(kubectl_bin, kubeconfig, "-n", ns, "apply", "-f", "-", stdin=configmap(name))

    def add_job(name: str) -> None:
        manifest = dispatch_job(f"{gate}-{name}")
        kubectl(kubectl_bin, kubeconfig, "-n", ns, "apply", "-f", "-", stdin=manifest)

    for name in ("a", "b"):
        add_configmap(name)
        add_job(name)
    async with client(kubeconfig) as api:
        informer = await informer_sees(api, ns, add_configmap)
        said = await store_sees(api, ns, add_job)
    assert informer.watch_list is (gate == "on")
    assert said == [
        ("shown", f"{gate}-a"),
        ("shown", f"{gate}-b"),
        ("synced", ""),
        ("shown", f"{gate}-c"),
    ]
    refused = [r.getMessage() for r in caplog.records if "no streamed list here" in r.getMessage()]
    assert len(refused) == (0 if gate == "on" else 2), refused  # the informer's and the store's


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[tuple[ControlPlane, str]]:
    """An API server of its own, to be restarted."""
    binaries = resolve_binaries()
    with ControlPlane(tmp_path / "cp", binaries=binaries) as cp:
        yield cp, binaries.kubectl


async def test_a_shared_watch_goes_on_across_a_restart_of_the_api_server(
    control_plane: tuple[ControlPlane, str],
) -> None:
    """The real kube-apiserver stopped and started again on the same etcd
    (``ControlPlane.replace_apiserver``, also how the scale bench puts another build of it under one
    lab): every stream breaks, and the informer must come back by itself and hear what changed."""
    cp, kubectl_bin = control_plane
    assert cp.binaries is not None

    def add(name: str) -> None:
        kubectl(kubectl_bin, cp.kubeconfig, "-n", "default", "apply", "-f", "-", stdin=configmap(name))

    for name in ("a", "b"):
        await asyncio.to_thread(add, name)
    heard: list[tuple[str, str]] = []
    changed = asyncio.Event()

    def on_change(old: Any, new: Any) -> None:
        body = new if new is not None else old
        heard.append(("deleted" if new is None else "shown", body["metadata"]["name"]))
        changed.set()

    async with client(cp.kubeconfig) as api:
        informer = configmap_informer(api, "default", on_change)
        task = asyncio.create_task(informer.run())
        try:
            async with asyncio.timeout(GUARD):
                await informer.synced.wait()
            pid = cp.pids["kube-apiserver"]
            await asyncio.to_thread(cp.replace_apiserver, cp.binaries.kube_apiserver)
            assert cp.pids["kube-apiserver"] != pid  # really another process
            await asyncio.to_thread(add, "c")
            await asyncio.to_thread(
                kubectl, kubectl_bin, cp.kubeconfig, "-n", "default", "delete", "configmap", "a"
            )
            async with asyncio.timeout(GUARD):
                while sorted(informer.items) != ["default/b", "default/c"]:
                    changed.clear()
                    await changed.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert heard[:2] == [("shown", "a"), ("shown", "b")]
    assert ("shown", "c") in heard[2:], heard
    assert ("deleted", "a") in heard[2:], heard
