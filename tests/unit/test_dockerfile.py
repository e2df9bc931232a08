"""The Dockerfile's structure (the built image itself is run by e2e/test_image.py, `make image`).

Parses the Dockerfile into stages and checks what the final image is: the builder's virtual
environment on a base with the same interpreter, a non-root USER matching the
chart's runAsUser, no RUN at all (so no pip, compiler or package manager can come in), ENTRYPOINT
the console script.
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


def test_two_stages_sharing_one_interpreter(stages: list[Stage]) -> None:
    """The venv links to the builder's python3.11, so by default both stages use the same base."""
    assert len(stages) == 2
    builder, final = stages
    assert builder.name == "builder"
    assert builder.base == final.base == "python:3.11-slim-bookworm"
    runs = " ".join(builder.all("RUN"))
    assert '"$(command -v python3.11)" -m venv /opt/dispatch' in runs


def test_default_bases_name_no_registry_host(stages: list[Stage]) -> None:
    """The project names no registry's host: a reference's first part is a host if it has a dot,
    a port or is localhost (the rule docker and podman apply to short names)."""
    for stage in stages:
        first, sep, _ = stage.base.partition("/")
        assert not (sep and ("." in first or ":" in first or first == "localhost")), stage.base


def test_builder_installs_the_operator_extras_then_a_wheel_without_network(stages: list[Stage]) -> None:
    runs = stages[0].all("RUN")
    deps = next(r for r in runs if "requirements/operator.txt" in r and "pip install" in r)
    assert "--require-hashes" in deps, "every file the image installs is checked against the lock"
    assert "--no-deps" in deps, "the lock is the whole closure: pip resolves nothing of its own"
    assert "--mount=type=secret,id=pip-cert" in deps, "a CA bundle comes in as a secret, never a layer"
    wheel = next(r for r in runs if "pip wheel" in r)
    assert "--no-build-isolation" in wheel
    assert "--no-deps" in wheel
    assert "pip uninstall --yes pip setuptools wheel" in wheel
    assert "--invalidation-mode unchecked-hash" in wheel, "a read-only root: bytecode must be used as is"
    assert "dispatch-operator --help" in wheel
    # The dependencies' layer is built before the operator's code is copied in (cache).
    keywords = [(kw, args) for kw, args in stages[0].instructions if kw in {"COPY", "RUN"}]
    copy_code = keywords.index(("COPY", "operator ./operator"))
    assert any("requirements/operator.txt" in a for _, a in keywords[:copy_code])


def test_final_stage_copies_only_the_venv_and_runs_nothing(stages: list[Stage]) -> None:
    final = stages[-1]
    assert final.all("COPY") == ["--from=builder /opt/dispatch /opt/dispatch"]
    assert not final.all("ADD")
    assert not final.all("RUN"), "the runtime base has no shell; nothing may be installed into it"
    assert "PATH=/opt/dispatch/bin:" in " ".join(final.all("ENV"))
    assert "HOME=/tmp" in " ".join(final.all("ENV")), "the only writable place (the chart's emptyDir)"


def test_final_stage_runs_as_the_charts_non_root_user(stages: list[Stage]) -> None:
    users = stages[-1].all("USER")
    assert users, "the final stage must set USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), "a numeric USER, so runAsNonRoot can verify it"
    assert int(uid) == NONROOT_UID
    chart_pod = (REPO / "charts" / "dispatch-operator" / "templates" / "deployment.yaml").read_text()
    assert f"runAsUser: {NONROOT_UID}" in chart_pod
    # The locally made runtime base (hack/image-base.sh) has the same user as distroless' nonroot.
    base_script = (REPO / "hack" / "image-base.sh").read_text()
    assert f"nonroot:x:{NONROOT_UID}:{NONROOT_UID}:" in base_script


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
    args, found = parse("ARG BASE=debian:12\nFROM ${BASE} AS b\nRUN a \\\n # c\n && b\nFROM ${BASE}\n")
    assert args == {"BASE": "debian:12"}
    assert [s.base for s in found] == ["debian:12", "debian:12"]
    assert found[0].all("RUN") == ["a  && b"]
