"""The Dockerfile, kept correct by construction (Docker cannot run here).

Parses the Dockerfile into stages and checks what the final image is: the builder's virtual
environment on a clean Python base, a non-root USER matching the chart's runAsUser, no pip, no
compiler, no build tools, ENTRYPOINT the console script.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
NONROOT_UID = 65532


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with line continuations joined and comments dropped."""
    logical: list[str] = []
    buffer = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        logical.append(buffer + line)
        buffer = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=alias))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    _, found = parse(DOCKERFILE.read_text())
    return found


def test_multi_stage_on_python_311_slim(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert builder.name == "builder"
    assert builder.base.startswith("python:3.11-slim")
    assert final.base.startswith(("python:3.11-slim", "gcr.io/distroless/python3"))


def test_builder_builds_a_wheel_into_a_venv(stages: list[Stage]) -> None:
    runs = " ".join(stages[0].all("RUN"))
    assert "python -m venv /opt/dispatch" in runs
    assert "-m build --wheel" in runs
    assert "[kube]" in runs, "the operator's dependencies are the 'kube' extra"


def test_final_stage_copies_only_the_venv(stages: list[Stage]) -> None:
    final = stages[-1]
    copies = final.all("COPY")
    assert copies == ["--from=builder /opt/dispatch /opt/dispatch"]
    assert not final.all("ADD")


def test_final_stage_has_no_build_tools(stages: list[Stage]) -> None:
    final = stages[-1]
    for command in final.all("RUN"):
        words = set(re.split(r"[\s;&|()]+", command))
        assert not words & {"gcc", "cc", "make", "build-essential", "apt-get", "apt", "curl", "wget"}, command
        assert "pip install" not in command, command
        assert "uninstall" in command or "pip" not in words, command
    assert "/opt/dispatch/bin" in " ".join(final.all("ENV"))


def test_final_stage_runs_as_the_charts_non_root_user(stages: list[Stage]) -> None:
    users = stages[-1].all("USER")
    assert users, "the final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "a numeric USER, so runAsNonRoot can verify it"
    assert int(uid) == NONROOT_UID
    chart_pod = (REPO / "charts" / "dispatch-operator" / "templates" / "deployment.yaml").read_text()
    assert f"runAsUser: {NONROOT_UID}" in chart_pod


def test_entrypoint_is_the_console_script(stages: list[Stage]) -> None:
    (entrypoint,) = stages[-1].all("ENTRYPOINT")
    argv = json.loads(entrypoint)
    assert argv == ["dispatch-operator"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "dispatch-operator" in scripts


def test_exposed_port_is_the_charts_metrics_port(stages: list[Stage]) -> None:
    values = yaml.safe_load((REPO / "charts" / "dispatch-operator" / "values.yaml").read_text())
    assert stages[-1].all("EXPOSE") == [str(values["metrics"]["port"])]


def test_build_context_holds_what_the_builder_copies(stages: list[Stage]) -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert "**" in ignore, ".dockerignore starts from nothing and lists what goes in"
    for copy in stages[0].all("COPY"):
        sources = shlex.split(copy)[:-1]
        for source in sources:
            assert (REPO / source).exists(), source
            assert f"!{source.rstrip('/')}" in {line.rstrip("/") for line in ignore}, source


def test_parser_joins_continuations_and_resolves_args() -> None:
    args, found = parse("ARG BASE=python:3.11-slim\nFROM ${BASE} AS b\nRUN a \\\n # c\n && b\nFROM ${BASE}\n")
    assert args == {"BASE": "python:3.11-slim"}
    assert [s.base for s in found] == ["python:3.11-slim", "python:3.11-slim"]
    assert found[0].all("RUN") == ["a  && b"]
