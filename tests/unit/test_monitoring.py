"""The chart's alerting rules and Grafana dashboard name only what the operator exports, and show it all.

One source: the metric and label names are read from the operator's metrics module (a fresh
:class:`~dispatch._controller.metrics.Metrics`), and every name the rules, the dashboard or
docs/observability.md use is checked against them, so a renamed metric or label fails here rather
than leaving a silent alert or an empty panel. ``promtool`` (``make promtool``) checks and unit-tests
the rules (tests/monitoring/) and lints the exposition; ``make rules-test`` requires it, the unit
tier runs it when it is built.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from dispatch._controller.metrics import Metrics
from tests.support.helm import required

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dispatch-operator"
RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
RULE_TESTS = ROOT / "tests" / "monitoring" / "prometheus-rules-test.yaml"
OBSERVABILITY = ROOT / "docs" / "observability.md"

SCRAPE_LABELS = frozenset({"namespace", "job", "instance", "pod", "service", "container", "endpoint"})
"""Labels a Prometheus scrape (a ServiceMonitor's) adds to every series; not the operator's."""
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}
METRIC = re.compile(r"\bdispatch_[a-z0-9_]+\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"\{([^}]*)\}")
LABEL_IN_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


@cache
def families() -> dict[str, tuple[str, frozenset[str]]]:
    """Each metric family of the operator: name -> (type, its label names)."""
    metrics = Metrics()
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            (family,) = value.describe()
            # prometheus_client keeps a metric's label names only in this attribute.
            found[family.name] = (family.type, frozenset(value._labelnames))
    registered = {f.name for f in metrics.registry.collect()}
    assert set(found) == registered, "a metric registered outside Metrics' attributes"
    return found


@cache
def series_labels() -> dict[str, frozenset[str]]:
    """Every series name a scrape shows (``dispatch_recoveries_total``, ``..._bucket``) -> its labels."""
    names: dict[str, frozenset[str]] = {}
    for name, (kind, labels) in families().items():
        for suffix in SUFFIXES[kind]:
            names[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, its variables' included."""
    doc = json.loads(DASHBOARD.read_text())
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", variable["definition"]


def exprs() -> Iterator[tuple[str, str]]:
    for rule in rules():
        yield f"alert {rule['alert']}", rule["expr"]
    yield from dashboard_exprs()


def labels_used(expr: str) -> set[str]:
    used = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
    for matchers in MATCHER.findall(expr):
        used.update(LABEL_IN_MATCHER.findall(matchers))
    used.update(re.findall(r"label_values\([^,]+,\s*([a-zA-Z_]+)\)", expr))
    return used


def test_every_metric_the_rules_and_the_dashboard_query_is_exported() -> None:
    for where, expr in exprs():
        unknown = set(METRIC.findall(expr)) - set(series_labels())
        assert not unknown, f"{where} queries {sorted(unknown)}, which the operator does not export: {expr}"


def test_every_label_they_group_or_match_by_is_the_metrics_or_the_scrapes() -> None:
    for where, expr in exprs():
        names = METRIC.findall(expr)
        assert names, f"{where} queries no dispatch metric: {expr}"
        known = SCRAPE_LABELS.union(*(series_labels()[n] for n in names))
        unknown = labels_used(expr) - known
        assert not unknown, f"{where} uses labels {sorted(unknown)} that {names} do not have: {expr}"


def test_every_alert_says_only_labels_its_expression_keeps() -> None:
    for rule in rules():
        kept = {label.strip() for g in GROUPING.findall(rule["expr"]) for label in g.split(",")}
        text = " ".join(rule["annotations"].values())
        said = set(re.findall(r"\$labels\.([a-zA-Z_]+)", text))
        assert said <= kept, f"alert {rule['alert']} says {sorted(said - kept)}, which `sum by` drops"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_the_dashboard_shows_every_metric() -> None:
    shown = {name for _, expr in dashboard_exprs() for name in METRIC.findall(expr)}
    for name, (kind, _) in families().items():
        assert any(name + s in shown for s in SUFFIXES[kind]), f"no panel of the dashboard shows {name}"


def test_the_dashboard_is_one_grafana_can_import() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "dispatch-operator"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in doc["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel.get("description"), f"panel {panel['title']} says nothing of what it shows"


def test_every_alert_has_a_promtool_case_where_it_fires_and_one_where_it_does_not() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    assert doc["rule_files"] == [os.path.relpath(RULES, RULE_TESTS.parent)]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    alerts = {rule["alert"] for rule in rules()}
    assert fires == alerts, f"alerts never seen firing: {sorted(alerts - fires)}"
    assert silent == alerts, f"alerts never checked silent: {sorted(alerts - silent)}"


def test_observability_lists_every_metric() -> None:
    text = OBSERVABILITY.read_text()
    section = text[text.index("## Metrics") :]
    section = section[: section.index("\n## ", 1)]
    listed = set(re.findall(r"^\| `(dispatch_[a-z0-9_]+)` \|", section, re.M))
    exported = {n + SUFFIXES[kind][0] if kind == "counter" else n for n, (kind, _) in families().items()}
    assert listed == exported, f"docs/observability.md's metrics table: {listed ^ exported}"


# ----------------------------------------------------------------------------------- promtool


def promtool() -> str | None:
    """promtool from ``$PROMTOOL`` (make exports it), else where ``make promtool`` builds it."""
    env = os.environ.get("PROMTOOL")
    if env:
        return env if os.access(env, os.X_OK) else None
    bins = (ROOT / "hack" / "build-bins.sh").read_text()
    version = re.search(r'^PROMTOOL_VERSION="\$\{PROMTOOL_VERSION:-(\S+)\}"$', bins, re.M)
    assert version, "hack/build-bins.sh pins no PROMTOOL_VERSION"
    cache = Path(os.environ.get("DISPATCH_CACHE") or Path.home() / ".cache" / "dispatch")
    path = cache / "bin" / f"promtool-{version.group(1)}" / "promtool"
    return str(path) if os.access(path, os.X_OK) else None


@pytest.fixture(scope="module")
def promtool_bin() -> str:
    return required(promtool(), "promtool", "DISPATCH_REQUIRE_PROMTOOL", "run `make promtool`")


def test_promtool_checks_and_unit_tests_the_rules(promtool_bin: str) -> None:
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run([promtool_bin, *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def test_promtool_finds_nothing_to_lint_in_the_exposition(promtool_bin: str) -> None:
    metrics = Metrics()
    metrics.api_request("get", "pods", 503)
    metrics.event_dropped("Recovering")
    metrics.reaction.observe(1.5)
    done = subprocess.run(
        [promtool_bin, "check", "metrics"], input=generate_latest(metrics.registry), capture_output=True
    )
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
