"""The distribution as a user gets it: the wheel built, installed with each extra into a fresh venv.

The wheel is built from what the Dockerfile builds it from (pyproject.toml, README.md, operator/);
each venv installs it and its dependencies from the package index, as
``pip install 'dispatch-jobs[EXTRA]'`` would. Then, in that venv alone: ``import dispatch``, the
backends the extra is for, and the console scripts it is for (tests/unit/test_packaging.py checks
the same from the import graph, without installing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
NAME = PROJECT["name"]
VERSION = next(
    line.split('"')[1]
    for line in (REPO / "operator" / "dispatch" / "_version.py").read_text().splitlines()
    if line.startswith("__version__")
)
KUBERNETES_ADAPTERS = [f"dispatch._backends.{n}._adapter" for n in ("kubeflow", "job", "jobset", "trainjob")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    shutil.copytree(
        REPO / "operator", src / "operator", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, src)
    (found,) = out.glob("*.whl")
    assert found.name == f"{NAME.replace('-', '_')}-{VERSION}-py3-none-any.whl"
    return found


def run(
    *args: str | Path, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=600, env=env, check=False, cwd=REPO
    )
    if check:
        assert done.returncode == 0, (
            f"{' '.join(map(str, args))}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done


class Venv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        # Nothing from the test's own environment: not its venv, not the repository's sources.
        self.env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        self.env["PATH"] = f"{self.bin}{os.pathsep}{os.environ['PATH']}"

    def python(self, code: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(self.bin / "python", "-I", "-c", code, env=self.env, check=check)

    def script(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        return run(self.bin / name, *args, env=self.env)


@pytest.fixture(scope="module")
def venvs(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Venv]:
    made: dict[str, Venv] = {}

    def make(extra: str) -> Venv:
        if extra not in made:
            venv = Venv(tmp_path_factory.mktemp(f"venv-{extra or 'base'}"))
            base = getattr(sys, "_base_executable", sys.executable)
            run(base, "-m", "venv", venv.root)
            run(
                venv.bin / "python",
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"{NAME}[{extra}] @ {wheel.as_uri()}" if extra else wheel,
                env=venv.env,
            )
            made[extra] = venv
        return made[extra]

    return {e: make(e) for e in ("", *PROJECT["optional-dependencies"]) if e != "dev"}


def test_every_extra_imports_dispatch_and_finds_every_backend(venvs: dict[str, Venv]) -> None:
    for extra, venv in venvs.items():
        done = venv.python(
            "import json, importlib.metadata as m, dispatch, dispatch._registry as r\n"
            "print(json.dumps([dispatch.__file__, dispatch.__version__,"
            f" m.version({NAME!r}), list(r.registered())]))"
        )
        where, version, dist_version, backends = json.loads(done.stdout)
        assert Path(where).is_relative_to(venv.root), f"[{extra}] imported {where}, not the installed wheel"
        assert version == dist_version == VERSION
        assert backends == ["job", "jobset", "kubeflow", "memory", "slurm", "trainjob"], extra


def test_the_base_runs_the_memory_and_slurm_backends_without_a_kubernetes_client(
    venvs: dict[str, Venv],
) -> None:
    base = venvs[""]
    base.python(
        "import asyncio, dispatch, dispatch._backends.slurm._adapter\n"
        "assert isinstance(asyncio.run(dispatch.open('memory', {})), dispatch.Cluster)"
    )
    missing = base.python("import aiohttp", check=False)
    assert "No module named 'aiohttp'" in missing.stderr


def test_kube_opens_the_kubernetes_backends(venvs: dict[str, Venv]) -> None:
    venvs["kube"].python("\n".join(f"import {m}" for m in KUBERNETES_ADAPTERS))


def test_cli_runs_the_kubectl_plugin(venvs: dict[str, Venv]) -> None:
    cli = venvs["cli"]
    assert cli.script("kubectl-dispatch", "--version").stdout.strip() == f"kubectl-dispatch {VERSION}"
    plan = cli.script("kubectl-dispatch", "plan", str(REPO / "examples" / "seed-dispatchjob.yaml"))
    assert plan.stdout.startswith("rule 0 is enforced by the supervisor"), plan.stdout


def test_operator_runs_the_operator(venvs: dict[str, Venv]) -> None:
    operator = venvs["operator"]
    assert VERSION in operator.script("dispatch-operator", "--version").stdout
    assert "--metrics-port" in operator.script("dispatch-operator", "--help").stdout


def test_a_script_without_its_extra_says_which_extra_to_install(venvs: dict[str, Venv]) -> None:
    base = venvs[""]
    for script, extra in (("kubectl-dispatch", "cli"), ("dispatch-operator", "operator")):
        done = run(base.bin / script, "--version", env=base.env, check=False)
        assert done.returncode == 2, (script, done.stderr)
        assert f"pip install 'dispatch-jobs[{extra}]'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
