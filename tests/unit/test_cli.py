"""The kubectl plugin without a cluster: ``plan`` prints the seed's two lines for the seed's
manifest, and the renderers turn a DispatchJob into tables, JSON and YAML."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

import dispatch
from dispatch import _dispatchjob
from dispatch._cli import _render as render
from dispatch._cli._manifest import ManifestError, parse
from dispatch._cli.main import main
from dispatch._model import RULE_CAUSES, Record
from tests.support import builders

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "seed-dispatchjob.yaml"
SEED_LINES = [
    "rule 0 is enforced by the supervisor",
    "uncovered: [node-lost out-of-memory time-limit non-zero-exit launch-failed no-capacity requeued unknown]",  # noqa: E501
]


def run(
    *argv: str, stdin: str | None = None, monkeypatch: pytest.MonkeyPatch | None = None
) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def manifest(**spec: Any) -> str:
    """The seed's job for Slurm unless ``spec`` names another backend."""
    return builders.manifest(**{"backend": "slurm", "command": ["torchrun", "train.py"], **spec})


def test_plan_of_the_seed_manifest_is_the_seeds_two_lines() -> None:
    code, out, err = run("plan", "-f", str(SEED))
    assert (code, err) == (0, "")
    assert out.splitlines() == SEED_LINES


@pytest.mark.parametrize("backend", ["slurm", "kubeflow"])
def test_plan_uses_the_capabilities_of_the_backend(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Kubeflow restarts on exactly [non-zero-exit out-of-memory] natively; Slurm enforces no rule
    # exactly: the same rule is the scheduler's on one and refused on the other.
    rule = {"on": ["non-zero-exit", "out-of-memory"], "action": "restart", "budget": 5}
    extra = {"kubeflow": {"image": "pytorch:2"}} if backend == "kubeflow" else {}
    text = manifest(backend=backend, recovery={"rules": [rule]}, **extra)
    code, out, err = run("plan", "-f", "-", stdin=text, monkeypatch=monkeypatch)
    if backend == "kubeflow":
        assert (code, err) == (0, "")
        assert out.splitlines()[0] == "rule 0 is enforced by the scheduler"
    else:
        assert code == 1
        assert err == (
            "refused: rule 0 cannot be enforced: only a scheduler can restart in place, and this one does "
            "not enforce restart on [non-zero-exit out-of-memory] with budget 5 (it enforces nothing)\n"
        )


@pytest.mark.parametrize("backend", ["slurm", "kubeflow"])
def test_a_restart_on_preemption_and_node_loss_is_refused_on_every_backend(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What Slurm's requeue covers, at its requeue limit: not exact on Slurm, not native on Kubeflow.
    rule = {"on": ["preempted", "node-lost"], "action": "restart", "budget": 5}
    extra = {"kubeflow": {"image": "pytorch:2"}} if backend == "kubeflow" else {}
    text = manifest(backend=backend, recovery={"rules": [rule]}, **extra)
    code, _, err = run("plan", "-f", "-", stdin=text, monkeypatch=monkeypatch)
    assert code == 1
    assert err.startswith("refused: rule 0 cannot be enforced: only a scheduler can restart in place")
    assert "restart on [preempted node-lost] with budget 5" in err
    resubmit = {**rule, "action": "resubmit"}
    text = manifest(backend=backend, recovery={"rules": [resubmit]}, **extra)
    code, out, err = run("plan", "-f", "-", stdin=text, monkeypatch=monkeypatch)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "rule 0 is enforced by the supervisor"


@pytest.mark.parametrize(
    "example", ["seed-dispatchjob.yaml", "slurm-dispatchjob.yaml", "kubeflow-dispatchjob.yaml"]
)
def test_the_example_manifests_are_accepted_by_the_plan(example: str) -> None:
    code, out, err = run("plan", "-f", str(ROOT / "examples" / example), "-o", "json")
    assert (code, err) == (0, "")
    plan = json.loads(out)
    assert plan["rules"]
    if example == "slurm-dispatchjob.yaml":  # Slurm enforces nothing: every rule is the supervisor's
        assert {r["enforcer"] for r in plan["rules"]} == {"supervisor"}
        assert {r["action"] for r in plan["rules"]} == {"resubmit"}
        assert ["preempted", "node-lost"] in [r["on"] for r in plan["rules"]]


def test_plan_json_and_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run("plan", "-f", str(SEED), "-o", "json", "-n", "team-a")
    assert code == 0
    data = json.loads(out)
    assert data["job"] == "team-a/finetune"
    assert data["rules"] == [
        {
            "index": 0,
            "on": ["preempted"],
            "action": "resubmit",
            "budget": 2,
            "enforcer": "supervisor",
            "firings": 0,
            "exitCodes": None,
        }
    ]
    assert data["uncovered"][0] == "node-lost"
    code, out, _ = run("plan", "-f", str(SEED), "-o", "yaml")
    assert yaml.safe_load(out) == {**data, "job": "default/finetune"}


def test_plan_refusal_with_json(monkeypatch: pytest.MonkeyPatch) -> None:
    text = manifest(recovery={"rules": [{"on": ["out-of-memory"], "action": "restart", "budget": 1}]})
    code, out, _ = run("plan", "-f", "-", "-o", "json", stdin=text, monkeypatch=monkeypatch)
    assert code == 1
    refused = json.loads(out)["refused"]
    assert refused["rule"] == 0
    assert "restart" in refused["reason"]


def test_plan_of_several_jobs_names_each(monkeypatch: pytest.MonkeyPatch) -> None:
    text = SEED.read_text() + "---\n" + manifest().replace("finetune", "other")
    code, out, _ = run("plan", "-f", "-", stdin=text, monkeypatch=monkeypatch)
    assert code == 0
    assert out.splitlines() == [
        "default/finetune:",
        *SEED_LINES,
        "",
        "default/other:",
        "uncovered: [preempted node-lost out-of-memory time-limit non-zero-exit launch-failed no-capacity "
        "requeued unknown]",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SEED.read_text().replace('"on"', "on"), 'quote it, e.g. "on": [preempted]'),
        (manifest(kubeflow={"image": "x"}), "spec.kubeflow is set but spec.backend is slurm"),
        (manifest(backend="kubeflow"), "spec.kubeflow (the image, at least) is required"),
        (manifest(backend="lsf"), f"spec.backend must be one of {_dispatchjob.backend_names()}, not 'lsf'"),
        (manifest(nodes=0), "spec.nodes: Input should be greater than or equal to 1"),
        (
            manifest(
                recovery={"rules": [{"on": ["preempted"], "budget": 1}, {"on": ["preempted"], "budget": 1}]}
            ),
            "already covered by rules[0]",
        ),
        ("kind: ConfigMap\n", "no DispatchJob in the manifest"),
    ],
)
def test_invalid_manifests_exit_2_and_say_why(
    text: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run("plan", "-f", "-", stdin=text, monkeypatch=monkeypatch)
    assert code == 2
    assert out == ""
    assert message in err


def test_seed_manifest_matches_the_seed_spec() -> None:
    (m,) = parse(SEED.read_text())
    assert m.backend == "slurm"
    assert m.spec == dispatch.JobSpec(
        name="finetune",
        command=("torchrun", "train.py"),
        nodes=2,
        recovery=dispatch.RecoveryPolicy(
            rules=(
                dispatch.Rule(on=(dispatch.CauseKind.PREEMPTED,), action=dispatch.Action.RESUBMIT, budget=2),
            )
        ),
    )


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as info:
        main([], stdout=io.StringIO(), stderr=io.StringIO())
    assert info.value.code == 2
    code, out, err = run("plan")
    assert (code, out) == (2, "")
    assert "plan FILE" in err


# ---- rendering a DispatchJob as the operator writes it ----------------------------------------------

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def recovered_object() -> dict[str, Any]:
    """The seed's recovered job as a DispatchJob: status = the record (minus job and spec) + conditions."""
    (m,) = parse(SEED.read_text(), namespace="team-a")
    plan = m.plan()
    ada = dispatch.Actor(kind=dispatch.ActorKind.HUMAN, id="ada")
    sup = dispatch.Actor(kind=dispatch.ActorKind.SUPERVISOR, id="supervisor")
    preempted = dispatch.Cause(kind=dispatch.CauseKind.PREEMPTED, detail="preempted by a higher-priority job")
    done = dispatch.Cause(kind=dispatch.CauseKind.NONE)
    rule = plan.rules[0].model_copy(update={"firings": 1})
    record = Record(
        job=m.job,
        spec=m.spec,
        plan=plan.model_copy(update={"rules": (rule,)}),
        submitted_by=ada,
        submitted_at=T0,
        supervised=True,
        state=dispatch.State.SUCCEEDED,
        cause=done,
        submissions=(
            dispatch.Submission(n=1, authorized_at=T0, authorized_by=sup, canonical="101", cause=preempted),
            dispatch.Submission(
                n=2,
                authorized_at=T0 + timedelta(seconds=30),
                authorized_by=sup,
                rule=0,
                canonical="102",
                cause=done,
            ),
        ),
        history=(
            dispatch.Transition.model_validate(
                {
                    "from": "pending",
                    "to": "recovering",
                    "submission": 2,
                    "cause": preempted,
                    "actor": sup,
                    "time": T0 + timedelta(seconds=30),
                }
            ),
            dispatch.Transition.model_validate(
                {
                    "from": "recovering",
                    "to": "succeeded",
                    "submission": 2,
                    "cause": done,
                    "actor": sup,
                    "time": T0 + timedelta(minutes=5),
                }
            ),
        ),
        settled=True,
    )
    # the status as the operator writes it: the record, the conditions and the observed fields
    status = _dispatchjob.record_write(
        record, previous=[], generation=1, now=T0 + timedelta(minutes=5), observed={}
    )
    body = yaml.safe_load(SEED.read_text())
    body["metadata"].update(
        {
            "namespace": "team-a",
            "creationTimestamp": "2025-03-01T12:00:00Z",
            "annotations": {"dispatch.dev/submitted-by": "ada"},
        }
    )
    body["status"] = status
    return dict(body)


def test_history_table_shows_the_seeds_transitions() -> None:
    text = render.history_table(_dispatchjob.transitions(recovered_object()))
    assert [re.split(r" {3,}", line) for line in text.splitlines()] == [
        ["TIME", "FROM", "TO", "SUBMISSION", "CAUSE", "ACTOR"],
        [
            "2025-03-01T12:00:30Z",
            "pending",
            "recovering",
            "2",
            "preempted by a higher-priority job",  # the kind is not said twice
            "supervisor:supervisor",
        ],
        ["2025-03-01T12:05:00Z", "recovering", "succeeded", "2", "none", "supervisor:supervisor"],
    ]


def test_history_as_json() -> None:
    data = [render.transition_data(t) for t in _dispatchjob.transitions(recovered_object())]
    assert [(d["from"], d["to"], d["submission"], d["cause"]["kind"], d["actor"]) for d in data] == [
        ("pending", "recovering", 2, "preempted", "supervisor:supervisor"),
        ("recovering", "succeeded", 2, "none", "supervisor:supervisor"),
    ]
    json.dumps(data)


def test_get_table_and_summary() -> None:
    obj = recovered_object()
    now = datetime(2025, 3, 1, 13, 0, 0, tzinfo=UTC)
    lines = render.get_table([obj], all_namespaces=True, now=now).splitlines()
    assert lines[0].split() == [
        "NAMESPACE",
        "NAME",
        "BACKEND",
        "STATE",
        "CAUSE",
        "SUBMISSION",
        "RECOVERIES",
        "READY",
        "REASON",
        "SUBMITTED-BY",
        "AGE",
    ]
    assert lines[1].split() == [
        "team-a",
        "finetune",
        "slurm",
        "succeeded",
        "-",  # the cause status shows: none once the job succeeded, as kubectl get dj
        "2",
        "1",
        "True",
        "Succeeded",
        "human:ada",
        "60m",
    ]
    s = render.summary(obj)
    assert s["submittedBy"] == "human:ada"
    assert s["settled"] is True
    assert s["recoveries"] == 1


def test_summary_of_a_refused_job_has_no_record() -> None:
    body = yaml.safe_load(SEED.read_text())
    body["metadata"]["annotations"] = {"dispatch.dev/submitted-by": "bob"}
    body["status"] = {
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "UnenforceableRule", "message": "rule 0 ..."}
        ]
    }
    s = render.summary(body)
    assert (s["state"], s["submission"], s["reason"], s["submittedBy"]) == (
        None,
        None,
        "UnenforceableRule",
        "bob",
    )
    assert "UnenforceableRule" in render.get_table([body], all_namespaces=False)


def test_describe_shows_plan_submissions_history_conditions_events() -> None:
    events = [
        {
            "eventTime": "2025-03-01T12:00:30.000000Z",
            "type": "Normal",
            "reason": "Recovering",
            "note": "rule 0 fired",
        }
    ]
    data = render.describe_data(recovered_object(), events)
    text = render.describe_text(data)
    assert "Submitted by: human:ada at 2025-03-01T12:00:00Z" in text
    assert "rule 0 (supervisor): resubmit on [preempted], budget 2, fired 1, 1 left" in text
    assert "uncovered: [node-lost out-of-memory" in text
    sub_lines = [
        re.split(r" {3,}", line.strip())
        for line in text.splitlines()
        if line.startswith("  1 ") or line.startswith("  2 ")
    ]
    # the timeline: when each submission ran, who started it, how it ended
    assert sub_lines[0] == [
        "1",
        "2025-03-01T12:00:00Z",
        "12:00:30Z",
        "start",
        "preempted by a higher-priority job",
    ]
    assert sub_lines[1] == ["2", "2025-03-01T12:00:30Z", "12:05:00Z", "rule 0", "succeeded"]
    assert "Recovering   rule 0 fired" in text
    assert yaml.safe_load(render.dump(data, "yaml"))["submissions"][1]["object"] == "102"
    assert "Note:" not in text
    assert data["note"] is None


def test_describe_and_get_show_why_the_current_object_does_not_run() -> None:
    obj = recovered_object()
    note = "pod finetune-2-master-0 unschedulable (no-capacity at 2025-03-01T12:05:30Z): 0/8 nodes"
    obj["status"]["observedNote"] = note
    data = render.describe_data(obj)
    assert f"Note:         {note}" in render.describe_text(data).splitlines()
    assert json.loads(render.dump(render.summary(obj), "json"))["note"] == note


def test_watch_line_and_key() -> None:
    obj = recovered_object()
    line = render.watch_line(obj, now=T0)
    assert line.startswith("2025-03-01T12:00:00Z  team-a/finetune  state=succeeded  cause=-  submission=2")
    assert "settled" in line
    assert "last: recovering -> succeeded (submission 2, by supervisor:supervisor)" in line
    changed = json.loads(json.dumps(obj))
    changed["status"]["settled"] = False
    assert render.watch_key(obj) != render.watch_key(changed)
    assert render.watch_key(obj) == render.watch_key(json.loads(json.dumps(obj)))


def test_manifest_errors_are_value_errors() -> None:
    assert issubclass(ManifestError, ValueError)


# ---- a user's mistake is one line, with the documented exit status ----------------------------------


def test_a_missing_or_directory_manifest_is_one_line_exit_2(tmp_path: Path) -> None:
    for path, words in ((tmp_path / "nope.yaml", "No such file"), (tmp_path, "is a directory")):
        code, out, err = run("plan", "-f", str(path))
        assert (code, out) == (2, "")
        assert words in err
        assert "Traceback" not in err
        assert err.count("\n") == 1


def test_a_missing_kubeconfig_is_one_line_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = run("get", "--kubeconfig", str(tmp_path / "kc"))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: kubeconfig {tmp_path / 'kc'} (--kubeconfig) does not exist")
    assert err.count("\n") == 1
    assert "Config not found" not in capfd.readouterr().err  # nothing logged by the client library


def test_plan_uses_the_kubeconfig_contexts_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
                "current-context": "x",
            }
        )
    )
    job = tmp_path / "job.yaml"
    job.write_text(manifest(recovery={"rules": [{"on": ["preempted"], "budget": 2}]}))
    code, out, _ = run("plan", "-f", str(job), "--kubeconfig", str(kubeconfig), "-o", "json")
    assert code == 0
    assert json.loads(out)["job"] == "team-a/finetune"


def test_exit_statuses_are_the_documented_ones() -> None:
    import dispatch._cli.main as cli

    assert (cli.Failure("x").code, cli.Usage("x").code, cli.TimedOut("x").code) == (1, 2, 3)
    assert "3 ``watch --timeout`` expired" in (cli.__doc__ or "")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--webhook-managed", "nodots", "--webhook-port", "9443"], "--webhook-managed 'nodots'"),
        (["--webhook-managed", "a.example.com"], "needs --webhook-port"),
        (["--metrics-port", "70000"], "--metrics-port 70000"),
        (["--health-addr", "not an address"], "--health-addr"),
        (["--slurm-config", "/nonexistent/slurm.yaml"], "--slurm-config /nonexistent/slurm.yaml"),
    ],
)
def test_operator_flags_are_checked_up_front(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatch._controller.main import main as operator_main

    with pytest.raises(SystemExit) as caught:
        operator_main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert words in err
    assert "Traceback" not in err


def test_operator_missing_kubeconfig_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dispatch._controller.main import main as operator_main

    assert operator_main(["--kubeconfig", str(tmp_path / "kc")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "does not exist" in err


def test_every_operator_port_has_an_address_flag() -> None:
    from dispatch._controller.main import parser

    flags = {a for action in parser()._actions for a in action.option_strings}
    for port in ("--metrics-port", "--health-port", "--webhook-port"):
        assert port in flags
        assert port.replace("-port", "-addr") in flags


# ---- the rough edges a new user hits ---------------------------------------------------------------


def test_version_says_which_plugin_this_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kubectl-dispatch {dispatch.__version__}"


def test_a_yaml_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: dispatch.dev/v1alpha1\nkind: DispatchJob\nmetadata: {name: a\nspec: [\n")
    for argv in (("plan", str(path)), ("plan", "-f", str(path))):
        code, out, err = run(*argv)
        assert (code, out) == (2, "")
        assert f'in "{path}", line 3' in err
        assert "<unicode string>" not in err


def _refusal(tmp_path: Path, **spec: Any) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(builders.manifest("a", backend_options={"image": "i"}, **spec))
    code, out, err = run("plan", str(path), "-n", "team-a")
    assert (code, out) == (2, "")
    return err


def test_refusals_name_fields_in_one_style_without_pydantics_prefix(tmp_path: Path) -> None:
    err = _refusal(
        tmp_path,
        recovery={"rules": [{"on": ["preempted"], "budget": 1}, {"on": ["none"], "budget": 1}]},
        nodes=0,
    )
    assert "spec.recovery.rules[1].on: 'none' means success; a rule covers only causes of failure" in err
    assert "spec.nodes: " in err
    assert "Value error" not in err
    assert not re.search(r"\.\d|\[key\]", err), err  # no rules.1, no pydantic's own steps


def test_a_pattern_is_said_in_words(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        builders.manifest(
            "a", backend_options={"image": "i", "resources": {"cpu": "lots"}, "env": {"A=B": "1"}}
        )
    )
    code, _, err = run("plan", str(path), "-n", "team-a")
    assert code == 2
    assert "spec.kubeflow.resources.cpu: must be a CPU quantity, such as 2, 0.5 or 500m, not 'lots'" in err
    assert "spec.kubeflow.env.A=B: an environment variable's name is" in err
    assert "without '='" in err
    for regex in ("pattern", "^", "\\x"):
        assert regex not in err, err


def test_an_unknown_cause_lists_only_the_causes_a_rule_can_name(tmp_path: Path) -> None:
    err = _refusal(tmp_path, recovery={"rules": [{"on": ["bogus"], "budget": 1}]})
    words = "spec.recovery.rules[0].on[0]: 'bogus' is not a cause a rule can name: one of "
    assert words in err
    listed = err.split(words)[1].split(";")[0].strip().split(", ")
    assert listed == [c.value for c in RULE_CAUSES]
    assert "none" not in listed
    assert "at least 1 item" not in err  # the list's own complaint repeats the item's


def test_describe_fits_100_columns_and_says_each_cause_once() -> None:
    obj = recovered_object()
    obj["status"]["observedNote"] = (
        "pod finetune-2-master-0 unschedulable: " + "0/8 nodes are available. " * 12
    )
    obj["status"]["submissions"][0]["cause"]["detail"] = "preempted: evicted by " + "a long reason " * 10
    events = [
        {
            "eventTime": "2025-03-01T12:00:30Z",
            "type": "Warning",
            "reason": "HeldOutside",
            "note": "suspended by another controller " * 8,
        }
    ]
    text = render.describe_text(render.describe_data(obj, events))
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert "preempted: preempted" not in text
    assert "preempted: evicted by a long reason" in text
    assert "preempted: preempted" not in _dispatchjob.cause_text("preempted", "preempted: evicted")


def test_describe_of_a_refused_job_shows_the_refusal_and_no_submitter() -> None:
    body = yaml.safe_load(SEED.read_text())
    body["metadata"].update({"namespace": "team-a", "generation": 1})
    body["status"] = _dispatchjob.refusal_write(
        "UnenforceableRule", "rule 0: nobody enforces node-lost", previous=[], generation=1, now=T0
    )
    text = render.describe_text(render.describe_data(body))
    assert "Refused:      UnenforceableRule: rule 0: nobody enforces node-lost" in text.splitlines()
    assert "Submitted by" not in text
    assert " - at -" not in text
