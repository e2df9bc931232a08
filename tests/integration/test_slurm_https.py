"""The Slurm backend over https://, on each real Slurm: slurmrestd behind a TLS-terminating proxy
whose certificate a site's private CA signs (``ca_file``). A job runs to success through it; without
the CA the backend refuses the server and never sends it the token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dispatch._backends.slurm._adapter import open_adapter
from dispatch._cluster import compose
from dispatch._errors import TransientBackendError
from dispatch._model import JobSpec, State
from tests.support.builders import ALICE
from tests.support.controlplane import loopback_tls
from tests.support.slurmlab import SlurmLab
from tests.support.slurmproxy import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


async def test_a_job_runs_through_https_with_the_sites_ca(slurm: SlurmLab, tmp_path: Path) -> None:
    server_tls, ca = loopback_tls(tmp_path, "slurm-site-ca")
    with FaultProxy(slurm.url, tls=server_tls) as proxy:
        assert proxy.url.startswith("https://")
        backend = open_adapter(slurm.backend_config(url=proxy.url, ca_file=str(ca), poll_interval=0.3))
        cluster = compose(backend)
        spec = JobSpec(name="tls", command=("true",))
        try:
            await cluster.operator.submit(spec, ALICE, supervised=True)
            record = await asyncio.wait_for(cluster.supervisor(poll_interval=0.5).run(spec.name), 120)
        finally:
            await cluster.aclose()
        assert record.state is State.SUCCEEDED, record
        assert proxy.served["pass"] >= 2, "every request went through the TLS proxy"

        untrusted = open_adapter(slurm.backend_config(url=proxy.url, poll_interval=0.3))
        before = proxy.served["pass"]
        try:
            with pytest.raises(TransientBackendError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusted.list("tls")
        finally:
            await untrusted.aclose()
        assert proxy.served["pass"] == before, "no request reached a server the trust store refuses"
