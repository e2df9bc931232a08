"""``kubectl-dispatch``: the kubectl plugin (``kubectl dispatch ...`` when it is on PATH).

Subcommands::

    plan -f job.yaml        the plan for a manifest, without creating anything (no cluster needed)
    get [NAME]              summaries of DispatchJobs (all in the namespace without NAME)
    describe NAME           plan, submissions and their objects, history, conditions, events
    history NAME            the recorded transitions: time, from, to, submission, cause, actor
    watch NAME              one line per status change as it happens, until the job is settled

Common flags: ``-n/--namespace``, ``-A/--all-namespaces`` (get), ``--kubeconfig``, ``--context``,
``-o json|yaml`` for machines (tables otherwise). Exit status (docs/cli.md): 0 done; 1 refused,
not found, nothing to cancel, or an API error; 2 bad usage, an invalid or unreadable manifest, or
a kubeconfig that cannot be read; 3 ``watch --timeout`` expired before the job settled. A user's
mistake is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

import aiohttp

from .. import _dispatchjob as dispatchjob
from .._constants import GROUP, KIND, PLURAL, SINGULAR
from .._errors import PlanError
from .._model import Cause
from .._simulate import parse_cause, simulate
from .._version import __version__
from . import _inject
from . import _render as render
from ._manifest import ManifestError, load

IN_CLUSTER_NAMESPACE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
WATCH_REQUEST_SECONDS: Final = 60

Body = dict[str, Any]


EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_TIMEOUT: Final = 3


class Failure(Exception):
    """Print the message and exit 1."""

    code = EXIT_FAILED


class Usage(Failure):
    """A mistake in what was given (a file, a kubeconfig): print the message and exit 2."""

    code = EXIT_USAGE


class TimedOut(Failure):
    """``watch --timeout`` expired before the job settled: exit 3."""

    code = EXIT_TIMEOUT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl dispatch",
        description="See what dispatch will do with a DispatchJob, and what it did.",
    )
    parser.add_argument("--version", action="version", version=f"kubectl-dispatch {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="the namespace (default: the kubeconfig context's)")
    common.add_argument(
        "--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument("-o", "--output", choices=("json", "yaml"), help="machine-readable output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "plan",
        parents=[common],
        help="print the plan for a manifest without creating anything",
        description="Print who enforces each rule and which causes no rule covers, as the operator would "
        "plan it (with the capabilities of the manifest's backend and a supervisor). No cluster needed.",
    )
    p.add_argument("file", nargs="?", help="the manifest (YAML; - for stdin), as with -f")
    p.add_argument("-f", "--filename", help="the manifest (YAML; - for stdin)")
    p.add_argument(
        "--simulate",
        metavar="CAUSES",
        help="walk the rules over these ends of submissions 1, 2, ... (comma-separated causes, such as "
        "preempted,preempted,out-of-memory; non-zero-exit:3 for an exit code): which rule fires, the "
        "backoff, the next submission and where the job ends, by the operator's own decision",
    )

    p = sub.add_parser("get", parents=[common], help="summarise DispatchJobs")
    p.add_argument("name", nargs="?", help="one DispatchJob (all in the namespace without it)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="list across all namespaces")

    p = sub.add_parser("describe", parents=[common], help="plan, submissions, objects, history, events")
    p.add_argument("name")

    p = sub.add_parser("history", parents=[common], help="the recorded transitions of a DispatchJob")
    p.add_argument("name")

    p = sub.add_parser(
        "cancel",
        parents=[common],
        help="cancel a DispatchJob, keeping its record",
        description="Set spec.cancel: the operator ends the job as cancelled, records who asked (from "
        "the admission webhook, which takes the identity of the caller) and ends its objects. The "
        "record is kept; delete the DispatchJob to remove it.",
    )
    p.add_argument("name")

    p = sub.add_parser(
        "suspend",
        parents=[common],
        help="suspend a DispatchJob: stop its running submission, start none",
        description="Set spec.suspend: the operator records the job suspended with the caller as the actor "
        "(from the admission webhook), stops the running submission (SIGTERM, then SIGKILL after its grace "
        "period) and authorizes no next one until it is resumed.",
    )
    p.add_argument("name")

    p = sub.add_parser(
        "resume",
        parents=[common],
        help="resume a suspended DispatchJob with a new submission",
        description="Clear spec.suspend: once the suspended submission has ended, the operator authorizes a "
        "new one, recorded with the caller as the actor; no rule fires and no budget is spent.",
    )
    p.add_argument("name")

    p = sub.add_parser(
        "retry",
        parents=[common],
        help="run a failed DispatchJob again under the same record",
        description="Raise spec.retry.count by one: once the failed job has settled, the operator reopens it "
        "(failed -> pending) with a new submission, recorded with the caller as the actor. No rule fires "
        "and no budget is spent; with --fresh-budget, rule --rule's budget starts afresh.",
    )
    p.add_argument("name")
    p.add_argument("--rule", type=int, metavar="N", help="the rule whose budget --fresh-budget renews")
    p.add_argument(
        "--fresh-budget",
        action="store_true",
        help="renew rule N's budget (its earlier firings no longer count)",
    )

    p = sub.add_parser(
        "preempt",
        parents=[common],
        help="evict a pod of the running submission, as a drain or a preemption does (to try recovery)",
        description="Evict one pod of the job's running submission through the Eviction API (as kubectl "
        "drain does; PodDisruptionBudgets apply). dispatch records the submission preempted and its rules "
        "decide what follows. Needs create on pods/eviction.",
    )
    p.add_argument("name")

    p = sub.add_parser(
        "lose-node",
        parents=[common],
        help="evict the pods on the node of the running submission, as a lost node does (to try recovery)",
        description=f"Taint the node of one of the job's running pods {_inject.NODE_LOSS_TAINT}:NoExecute, "
        "as the node lifecycle controller taints a node that stops answering: the taint eviction controller "
        "deletes the pods there, dispatch records the submission node-lost, and the taint is removed once "
        "they have left. Needs patch on nodes.",
    )
    p.add_argument("name")

    p = sub.add_parser("watch", parents=[common], help="follow a DispatchJob's status as it changes")
    p.add_argument("name")
    p.add_argument(
        "--timeout", type=float, default=0.0, help="give up after this many seconds (default: until settled)"
    )
    return parser


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """The console script ``kubectl-dispatch``."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        if args.command == "retry" and args.fresh_budget != (args.rule is not None):
            raise Usage("retry: --fresh-budget and --rule N go together (renew rule N's budget)")
        if args.command == "plan":
            return plan(args, out, err)
        return asyncio.run(_remote(args, out))
    except ManifestError as error:
        print(f"error: {error}", file=err)
        return EXIT_USAGE
    except Failure as error:
        print(f"error: {error}", file=err)
        return error.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


# ---- plan (local) -----------------------------------------------------------------------------------


def plan(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # The namespace of a manifest without one is the kubeconfig context's, as for every command.
    path = args.filename or args.file
    if not path or (args.filename and args.file):
        raise Usage("plan takes one manifest: kubectl dispatch plan FILE (or -f FILE)")
    manifests = load(path, namespace=_default_namespace(args))
    causes = _causes(args.simulate)
    results: list[Any] = []
    refused = False
    for i, manifest in enumerate(manifests):
        try:
            p = manifest.plan()
        except PlanError as error:
            refused = True
            if args.output:
                refusal = {"rule": error.rule, "reason": error.reason}
                if error.field is not None:  # a field the backend cannot honour (spec.queue)
                    refusal = {"field": error.field, "reason": error.reason}
                results.append({"job": manifest.job, "refused": refusal})
            else:
                prefix = f"{manifest.job}: " if len(manifests) > 1 else ""
                print(f"{prefix}refused: {error}", file=err)
            continue
        sim = simulate(manifest.spec, p, causes) if causes is not None else None
        if args.output:
            data = render.plan_data(p)
            if sim is not None:
                data = {"plan": data, "simulation": render.simulation_data(sim)}
            results.append(data)
            continue
        if len(manifests) > 1:
            if i:
                print(file=out)
            print(f"{manifest.job}:", file=out)
        for line in render.plan_lines(p):
            print(line, file=out)
        if sim is not None:
            print(file=out)
            for line in render.simulation_lines(sim):
                print(line, file=out)
    if args.output:
        print(render.dump(results[0] if len(results) == 1 else results, args.output), file=out)
    return 1 if refused else 0


def _causes(text: str | None) -> list[Cause] | None:
    """``--simulate``'s causes, or None without it; a word that is no cause is a usage error."""
    if text is None:
        return None
    try:
        return [parse_cause(word) for word in text.split(",") if word.strip()]
    except ValueError as error:
        raise Usage(f"--simulate: {error}") from None


# ---- commands that read the cluster -----------------------------------------------------------------


def _default_namespace(args: argparse.Namespace) -> str:
    """``-n``, else the kubeconfig context's namespace, else the pod's, else ``default``.

    Never fails: ``plan`` needs no cluster, and the commands that do say what is wrong with the
    kubeconfig when they load it.
    """
    if args.namespace:
        return str(args.namespace)
    from .._errors import ConfigError
    from .._kubeclient import kubeconfig_problem, load_kubeconfig

    if kubeconfig_problem(args.kubeconfig) is None:
        try:
            ns = load_kubeconfig(args.kubeconfig, context=args.context).namespace
        except ConfigError:  # a broken or in-cluster-only kubeconfig: the fallbacks below
            ns = None
        if ns:
            return ns
    if args.kubeconfig is None and os.path.exists(IN_CLUSTER_NAMESPACE):
        with open(IN_CLUSTER_NAMESPACE) as f:
            return f.read().strip() or "default"
    return "default"


async def _remote(args: argparse.Namespace, out: TextIO) -> int:
    from .. import _kubeclient
    from .._errors import ConfigError, TransientBackendError

    problem = _kubeclient.kubeconfig_problem(args.kubeconfig)
    if problem is not None:
        raise Usage(problem)
    namespace = _default_namespace(args)
    try:
        api = await _kubeclient.new_client(args.kubeconfig, context=args.context)
    except ConfigError as error:  # a kubeconfig dispatch cannot use (it names the file and field)
        raise Usage(f"cannot load the kubeconfig: {error}") from None
    async with api:
        objects = _kubeclient.CustomObjects(api)
        try:
            if args.command == "get":
                return await get(args, objects, namespace, out)
            if args.command == "describe":
                return await describe(args, objects, namespace, out)
            if args.command == "history":
                return await history(args, objects, namespace, out)
            if args.command == "watch":
                return await watch(args, api, namespace, out)
            if args.command == "cancel":
                return await cancel(args, objects, namespace, out)
            if args.command in ("suspend", "resume"):
                return await suspend(args, objects, namespace, out)
            if args.command == "retry":
                return await retry(args, objects, namespace, out)
            if args.command == "preempt":
                return await _inject.preempt(api, namespace, args.name, out)
            if args.command == "lose-node":
                return await _inject.lose_node(api, namespace, args.name, out)
        except _inject.NothingToDisrupt as error:
            raise Failure(str(error)) from None
        except _kubeclient.NotFound:
            raise Failure(f'{PLURAL}.{GROUP} "{args.name}" not found in namespace {namespace}') from None
        except _kubeclient.ApiError as error:
            raise Failure(str(error)) from None
        except TransientBackendError as error:  # no answer, a timeout, 429 or 5xx
            raise Failure(f"cannot reach the API server: {error}") from None
        except (OSError, aiohttp.ClientError) as error:  # a server that does not answer
            raise Failure(f"cannot reach the API server: {error}") from None
    raise Failure(f"unknown command {args.command!r}")


async def get(args: argparse.Namespace, objects: Any, namespace: str, out: TextIO) -> int:
    if args.name:
        items = [await objects.get(namespace, args.name)]
    else:
        items, _ = await objects.list(None if args.all_namespaces else namespace)
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
    if args.output:
        data = [render.summary(o) for o in items]
        print(render.dump(data[0] if args.name else data, args.output), file=out)
        return 0
    if not items:
        where = "any namespace" if args.all_namespaces else f"namespace {namespace}"
        print(f"No {PLURAL} found in {where}.", file=out)
        return 0
    print(render.get_table(items, all_namespaces=bool(args.all_namespaces) and not args.name), file=out)
    return 0


async def _events(api: Any, namespace: str, name: str) -> list[Body]:
    from .._errors import BackendError
    from .._kubeclient import request

    try:
        found = await request(
            api,
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={"fieldSelector": f"involvedObject.name={name},involvedObject.kind={KIND}"},
        )
    except BackendError:
        return []  # events are a courtesy: a user without access to them still gets the rest
    items: list[Body] = found.get("items") or []

    def when(e: Body) -> str:
        return str(
            e.get("eventTime") or e.get("lastTimestamp") or e.get("metadata", {}).get("creationTimestamp")
        )

    return sorted(items, key=when)


async def describe(args: argparse.Namespace, objects: Any, namespace: str, out: TextIO) -> int:
    obj = await objects.get(namespace, args.name)
    events = await _events(objects.api, namespace, args.name)
    data = render.describe_data(obj, events)
    print(render.dump(data, args.output) if args.output else render.describe_text(data), file=out)
    return 0


async def history(args: argparse.Namespace, objects: Any, namespace: str, out: TextIO) -> int:
    obj = await objects.get(namespace, args.name)
    ts = dispatchjob.transitions(obj)
    failed = render.failures_of(obj)
    if args.output:
        data = [
            render.transition_data(t) | {"cost": render.failure_data(render.failure_of(t, failed))}
            for t in ts
        ]
        print(render.dump(data, args.output), file=out)
        return 0
    if not ts:
        state = (obj.get("status") or {}).get("state") or "not yet recorded"
        print(f"No transitions recorded yet (state: {state}).", file=out)
        return 0
    print(render.history_table(ts, failed), file=out)
    return 0


async def cancel(args: argparse.Namespace, objects: Any, namespace: str, out: TextIO) -> int:
    """Set spec.cancel, saying so when it was already set or the job already has its outcome."""
    name = f"{SINGULAR}.{GROUP}/{args.name}"
    obj = await objects.get(namespace, args.name)
    state = (obj.get("status") or {}).get("state")
    if (obj.get("spec") or {}).get("cancel"):
        note = "already cancelled" if state == "cancelled" else "cancel already requested"
        code = EXIT_OK
    elif state in ("succeeded", "failed"):
        note, code = f"already {state}: nothing to cancel", EXIT_FAILED
    else:
        obj = await objects.merge_patch(namespace, args.name, {"spec": {"cancel": True}})
        note, code = "cancel requested", EXIT_OK
    return _said(args, obj, f"{name} {note}", code, out)


async def suspend(args: argparse.Namespace, objects: Any, namespace: str, out: TextIO) -> int:
    """Set spec.suspend (``suspend``) or clear it (``resume``), saying so when there is nothing to do."""
    want = args.command == "suspend"
    name = f"{SINGULAR}.{GROUP}/{args.name}"
    obj = await objects.get(namespace, args.name)
    state = (obj.get("status") or {}).get("state")
    code = EXIT_OK
    if bool((obj.get("spec") or {}).get("suspend")) == want:
        note = "already suspended" if want else "not suspended: nothing to resume"
    elif want and state in ("succeeded", "failed", "cancelled"):
        note, code = f"already {state}: nothing to suspend", EXIT_FAILED
    else:
        obj = await objects.merge_patch(namespace, args.name, {"spec": {"suspend": want}})
        note = "suspend requested" if want else "resume requested"
    return _said(args, obj, f"{name} {note}", code, out)


async def retry(args: argparse.Namespace, objects: Any, namespace: str, out: TextIO) -> int:
    """Raise spec.retry.count by one (with spec.retry.freshBudget for --fresh-budget)."""
    name = f"{SINGULAR}.{GROUP}/{args.name}"
    obj = await objects.get(namespace, args.name)
    spec = obj.get("spec") or {}
    state = (obj.get("status") or {}).get("state")
    if state != "failed":
        return _said(
            args, obj, f"{name} is {state or 'not yet recorded'}: only a failed job is retried", 1, out
        )
    rules = len((spec.get("recovery") or {}).get("rules") or ())
    if args.rule is not None and not 0 <= args.rule < rules:
        raise Usage(f"retry: --rule {args.rule}: the job has no rule {args.rule} (it has {rules})")
    count = dispatchjob.retry_count(spec) + 1
    patch = {"spec": {"retry": {"count": count, "freshBudget": args.rule}}}
    obj = await objects.merge_patch(namespace, args.name, patch)
    fresh = f", with a fresh budget for rule {args.rule}" if args.rule is not None else ""
    return _said(args, obj, f"{name} retry {count} requested{fresh}", EXIT_OK, out)


def _said(args: argparse.Namespace, obj: Body, note: str, code: int, out: TextIO) -> int:
    """Print what a command that asks something of a job did: its note, or the job's summary."""
    if args.output:
        print(render.dump(render.summary(obj), args.output), file=out)
    else:
        print(note, file=out)
    return code


async def watch(args: argparse.Namespace, api: Any, namespace: str, out: TextIO) -> int:
    try:
        if args.timeout and args.timeout > 0:
            async with asyncio.timeout(args.timeout):
                return await _follow(args, api, namespace, out)
        return await _follow(args, api, namespace, out)
    except TimeoutError:
        raise TimedOut(f"{args.name} not settled after {args.timeout:g}s") from None


async def _follow(args: argparse.Namespace, api: Any, namespace: str, out: TextIO) -> int:
    """List the one object, then watch it from the list's resourceVersion; relist on 410."""
    from .._kubeclient import CustomObjects, Gone

    objects = CustomObjects(api)
    selector = f"metadata.name={args.name}"
    last: tuple[Any, ...] | None = None

    def show(obj: Body) -> bool:
        """Print when something changed; True once the job is settled."""
        nonlocal last
        key = render.watch_key(obj)
        if key != last:
            last = key
            if args.output:
                print(
                    json.dumps(render.summary(obj))
                    if args.output == "json"
                    else render.dump([render.summary(obj)], "yaml"),
                    file=out,
                    flush=True,
                )
            else:
                print(render.watch_line(obj), file=out, flush=True)
        return bool((obj.get("status") or {}).get("settled"))

    resource_version: str | None = None
    while True:
        if resource_version is None:
            items, resource_version = await objects.list(namespace, field_selector=selector)
            if not items and last is None:
                raise Failure(f'{PLURAL}.{GROUP} "{args.name}" not found in namespace {namespace}')
            for item in items:
                if show(item):
                    return 0
        try:
            async for event in objects.watch(
                namespace,
                resource_version=resource_version,
                field_selector=selector,
                timeout_seconds=WATCH_REQUEST_SECONDS,
            ):
                obj = event.object
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    resource_version = str(rv)
                if event.type == "BOOKMARK":
                    continue
                if event.type == "DELETED":
                    print(f"{namespace}/{args.name} deleted", file=out, flush=True)
                    return 0
                if show(obj):
                    return 0
        except Gone:
            resource_version = None


if __name__ == "__main__":
    raise SystemExit(main())
