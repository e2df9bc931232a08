"""The DispatchJob CRD, generated from the pydantic models (the single source of the API).

The spec is the core's :class:`~dispatch.JobSpec` without ``name`` (the job's name is the object's
``metadata.name``) plus ``backend`` and a person's asks (``cancel``, ``suspend``, ``retry``), the
fields that may change after creation.
The status is the :class:`~dispatch.Record` (without ``job`` and ``spec``, which the object itself
holds) plus ``observedGeneration`` and ``conditions``.

The pydantic JSON schema is made structural for the API server: every ``$ref`` inlined, ``X | None``
turned into the schema of ``X`` (a null is pruned by the API server, which then applies the
default), defaults kept in the spec, ``maxLength``/``maxItems`` on every string and list, enums kept.
What a schema cannot say is said in CEL (``x-kubernetes-validations``).
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import sys
import textwrap
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Final

from pydantic import BaseModel

from .. import _model, _registry
from .._constants import (
    API_VERSION,
    CATEGORY,
    CRD_NAME,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    STATUS_OBSERVED_CAUSE,
    STATUS_OBSERVED_NOTE,
    STATUS_OBSERVED_STATE,
    VERSION,
)
from .._dispatchjob import ENV_NAME_WORDS, SPEC_MUTABLE, STATUS_COST
from .._model import (
    ENV_NAME_PATTERN,
    MAX_NAME_LENGTH,
    MAX_RULES,
    RULE_CAUSES,
    CauseKind,
    Cost,
    JobSpec,
    Record,
    State,
)

Schema = dict[str, Any]


DEFAULT_MAX_LENGTH: Final = 1024
"""For strings the models leave unbounded (ids, details written by dispatch)."""
DEFAULT_MAX_ITEMS: Final = 4096
"""For lists the models leave unbounded (submissions, history: bounded in practice by the budgets)."""
DATE_TIME_MAX_LENGTH: Final = 64

CANCEL_DESCRIPTION: Final = (
    "Set to true to cancel the job: dispatch ends its objects and records the outcome `cancelled` with "
    "the actor (annotation `dispatch.dev/cancelled-by`, set by the admission webhook, else `human:unknown`). "
    "The only field that may change after creation, and only from false to true."
)
SUSPEND_DESCRIPTION: Final = (
    "Set to true to suspend the job: dispatch records the state `suspended` with the actor (annotation "
    "`dispatch.dev/suspended-by`, set by the admission webhook from whoever changed this field), stops the "
    "running submission (SIGTERM, then SIGKILL after the grace period) and authorizes no next one. Set back "
    "to false to resume: a new submission is authorized once the suspended one has ended, recorded with "
    "the actor; no rule fires and no budget is spent."
)
RETRY_DESCRIPTION: Final = (
    "A person's retry of a failed job. Raise `count` (it never goes down) to ask for one retry: once "
    "the failed job has settled, dispatch reopens it (`failed` -> `pending`) with a new submission under the "
    "same record, recorded with the actor (annotation `dispatch.dev/retried-by`, set by the admission "
    "webhook). Applying the same count again asks for nothing, so a manifest kept in Git is applied as "
    "often as its tool likes. Refused unless the job has failed."
)
RETRY_COUNT_DESCRIPTION: Final = (
    "The retries asked for so far: one more than the last retry dispatch took asks for another. The count "
    "a job is created with is its starting point, not a retry."
)
FRESH_BUDGET_DESCRIPTION: Final = (
    "The index of a rule whose budget starts afresh with the retry (its earlier firings no longer count)."
)
OBSERVED_STATE_DESCRIPTION: Final = (
    "The state status shows now (`running` and `cancelling` included), written by the operator when it "
    "changes; `state` is the recorded one. The State printer column."
)
OBSERVED_CAUSE_DESCRIPTION: Final = (
    "The cause status shows now: absent while a run is running or when no run has ended; `cause` is the "
    "recorded one. The Cause printer column."
)
OBSERVED_NOTE_DESCRIPTION: Final = (
    "What the scheduler shows of the current object that is not dispatch's doing: held outside dispatch "
    "(suspended by another controller after dispatch released it, such as Kueue evicting it), and by whom "
    "(the field manager that suspended it); or else why it waits: in Kueue's queue (Kueue's message), a pod "
    "unschedulable for 5 s (that pod, what kube-scheduler said and when the wait becomes `no-capacity`), on "
    "Slurm the reason a released job waits, as squeue shows it; while a rule's backoff runs, when the next "
    "submission is due (`next submission at <time> (backoff <s> s before firing <k> of rule <i>)`). Absent "
    "otherwise."
)
OBSERVED_GENERATION_DESCRIPTION: Final = "The metadata.generation of the spec the status was computed from."
CONDITIONS_DESCRIPTION: Final = (
    "kstatus conditions: `Ready` (the summary, reason always set), `Reconciling` and `Stalled` (present "
    "only while true), `Succeeded` and `Failed` (the outcome; a cancelled job is `Failed` with reason "
    "`Cancelled`)."
)
STATUS_DESCRIPTION: Final = (
    "The record, written only by compare-and-swap (a PUT of /status carrying the resourceVersion read), "
    "plus conditions computed from it."
)
COST_DESCRIPTION: Final = (
    "What recovery has cost the job: in total and per cause, the failures, the time from each to "
    "the next submission running, and the node- and GPU-seconds of the submissions that failed. "
    "Computed from the record and the live objects and written with the writes there are anyway; "
    "absent until a submission fails."
)
SPEC_DESCRIPTION: Final = (
    "What to run and how to recover it. Immutable once created, apart from a person's asks: `cancel`, "
    "`suspend` and `retry`. "
    "The job's name is metadata.name (at most 48 characters)."
)


def _refuse_replaced(backend: str, schema: Schema, replaced: Mapping[str, str]) -> None:
    """A field a backend's options once had is kept in the schema only to be refused with the field
    that replaced it (without it, the API server would prune it silently or call it unknown)."""
    for old, new in sorted(replaced.items()):
        # Typed as the old field was (both were integers): CEL sees no field without a type.
        schema.setdefault("properties", {})[old] = {
            "type": "integer",
            "description": f"Replaced by `{new}`: refused.",
        }
        schema.setdefault("x-kubernetes-validations", []).append(
            {"rule": f"!has(self.{old})", "message": f"spec.{backend}.{old} is replaced by {new}"}
        )


def backend_description() -> str:
    """``spec.backend``'s description: every backend a DispatchJob may name, from the registry."""
    names = "; ".join(f"`{b.name}`: {b.summary}" for b in _registry.spec_backends())
    return f"Which scheduler runs the job ({names})."


# ---- pydantic JSON schema -> structural OpenAPI v3 -------------------------------------------------


def _attribute_docstrings(cls: type, module: ModuleType = _model) -> dict[str, str]:
    """Attribute docstrings (a string right after an annotated field) of one class of ``module``.

    Read from the module's source, not ``inspect.getsource(cls)``: public models report
    ``__module__ == "dispatch"``, where their source is not.
    """
    try:
        source = textwrap.dedent(inspect.getsource(module))
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    if not classes:
        return found
    statements = classes[0].body
    for stmt, nxt in itertools.pairwise(statements):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            found[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return found


def _models() -> dict[str, tuple[type[BaseModel], ModuleType]]:
    """The core's models and every registered backend's options model, by class name."""
    found: dict[str, tuple[type[BaseModel], ModuleType]] = {
        name: (obj, _model)
        for name, obj in vars(_model).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ in (_model.__name__, "dispatch")  # public models report dispatch
    }
    declared = [info.options for info in _registry.option_fields().values()]
    declared += [info.change for info in _registry.change_fields().values()]
    for model in declared:
        assert model is not None
        for cls in model.__mro__:
            if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__name__ not in found:
                module = sys.modules.get(cls.__module__)
                if module is not None:
                    found[cls.__name__] = (cls, module)
    return found


def _describe_defs(defs: dict[str, Schema]) -> None:
    """Put each field's attribute docstring into its schema's description."""
    models = _models()
    for name, schema in defs.items():
        entry = models.get(name)
        if entry is None or "properties" not in schema:
            continue
        cls, module = entry
        docs = _attribute_docstrings(cls, module)
        for field_name, info in cls.model_fields.items():
            alias = info.alias or field_name
            text = info.description or docs.get(field_name)
            if text and alias in schema["properties"]:
                schema["properties"][alias]["description"] = text


_DROP: Final = frozenset({"title", "additionalProperties", "propertyNames", "$defs"})


def _structural(node: Any, defs: dict[str, Schema], *, keep_defaults: bool) -> Any:
    """Inline refs, unwrap ``X | None``, drop what a structural schema may not hold."""
    if isinstance(node, list):
        return [_structural(item, defs, keep_defaults=keep_defaults) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**copy.deepcopy(target), **node}
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1 and len(node["anyOf"]) == 2:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            option = options[0]
            if "$ref" in option:
                option = {**copy.deepcopy(defs[option["$ref"].rsplit("/", 1)[-1]])}
            node = {**option, **rest}
        else:
            raise ValueError(f"cannot make a structural schema of anyOf {node['anyOf']!r}")
    # Kubernetes' structural schemas have no patternProperties (pydantic writes it for a dict whose
    # keys carry a pattern): the values become additionalProperties and the key pattern a CEL rule.
    key_pattern: str | None = None
    if "patternProperties" in node:
        patterns = node.pop("patternProperties")
        if len(patterns) != 1:
            raise ValueError(f"cannot make a structural schema of patternProperties {patterns!r}")
        [(key_pattern, node["additionalProperties"])] = patterns.items()
    out: Schema = {}
    map_keys: Schema | None = None
    for key, value in node.items():
        if key == "propertyNames":
            map_keys = value
        if key in _DROP and not (key == "additionalProperties" and isinstance(value, dict)):
            continue
        if key == "default":
            if value is None or not keep_defaults:
                continue
            out[key] = _prune_nulls(value)
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema's number (pydantic's gt/lt); the API server's OpenAPI v3 takes a bound and
            # a boolean, as draft 4 has it.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs, keep_defaults=keep_defaults) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _structural(value, defs, keep_defaults=keep_defaults)
        else:
            out[key] = value
    if out.get("type") == "string" and "enum" not in out:
        out.setdefault(
            "maxLength", DATE_TIME_MAX_LENGTH if out.get("format") == "date-time" else DEFAULT_MAX_LENGTH
        )
    if out.get("type") == "array":
        out.setdefault("maxItems", DEFAULT_MAX_ITEMS)
    if map_keys is not None:
        low = int(map_keys.get("minLength", 0))
        high = int(map_keys.get("maxLength", DEFAULT_MAX_LENGTH))
        out.setdefault("x-kubernetes-validations", []).append(
            {
                "rule": f"self.all(k, k.size() >= {max(low, 1)} && k.size() <= {high})",
                "message": f"keys must be 1 to {high} characters long",
            }
        )
    if key_pattern is not None:
        cel_pattern = key_pattern.replace("\\", "\\\\").replace("'", "\\'")
        words = ENV_NAME_WORDS if key_pattern == ENV_NAME_PATTERN else f"keys must match {key_pattern}"
        out.setdefault("x-kubernetes-validations", []).append(
            {"rule": f"self.all(k, k.matches('{cel_pattern}'))", "message": words}
        )
    return out


def _prune_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


def _schema_of(model: type[BaseModel], *, keep_defaults: bool) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Schema] = raw.get("$defs", {})
    _describe_defs(defs)
    _describe_defs({model.__name__: raw})
    result: Schema = _structural(raw, defs, keep_defaults=keep_defaults)
    return result


# ---- spec ------------------------------------------------------------------------------------------

# Every spec field but a person's asks (cancel, suspend, retry) and the time to live once settled
# is immutable once created.
_IMMUTABLE_REQUIRED: Final = ("backend", "command")


def spec_schema() -> Schema:
    schema = _schema_of(JobSpec, keep_defaults=True)
    props: Schema = schema["properties"]
    del props["name"]
    del props["options"]  # on the wire each backend's options are spec.<backend>
    for name, info in _registry.option_fields().items():
        if info.options is not None and info.in_spec:
            props[name] = _schema_of(info.options, keep_defaults=True)
            props[name]["description"] = f"How to run on backend `{name}`: {info.summary}."
            _refuse_replaced(name, props[name], info.options.REPLACED)
    schema["required"] = [r for r in schema.get("required", []) if r != "name"]
    props["backend"] = {
        "type": "string",
        "enum": [b.name for b in _registry.spec_backends()],
        "description": backend_description(),
    }
    props["cancel"] = {"type": "boolean", "default": False, "description": CANCEL_DESCRIPTION}
    props["suspend"] = {"type": "boolean", "default": False, "description": SUSPEND_DESCRIPTION}
    props["retry"] = {
        "type": "object",
        "description": RETRY_DESCRIPTION,
        "required": ["count"],
        "properties": {
            "count": {"type": "integer", "minimum": 0, "description": RETRY_COUNT_DESCRIPTION},
            "freshBudget": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_RULES - 1,
                "description": FRESH_BUDGET_DESCRIPTION,
            },
        },
    }
    schema["required"] = sorted({*schema["required"], "backend"})
    schema["description"] = SPEC_DESCRIPTION

    # A rule's change of a backend's own fields is change.<backend>, as its options are spec.<backend>.
    change = props["recovery"]["properties"]["rules"]["items"]["properties"]["change"]
    del change["properties"]["options"]
    for name, info in _registry.change_fields().items():
        if info.change is not None and info.in_spec:
            change["properties"][name] = _schema_of(info.change, keep_defaults=True)
            change["properties"][name]["description"] = (
                f"What a firing changes of spec.{name} (backend `{name}` only): each field set replaces "
                "that field for the submission the firing authorizes and the ones after it."
            )

    # A rule covers only causes of failure ('none' is success), each cause at most once.
    on = props["recovery"]["properties"]["rules"]["items"]["properties"]["on"]
    on["items"]["enum"] = [c.value for c in RULE_CAUSES]
    on["x-kubernetes-list-type"] = "set"
    rules = props["recovery"]["properties"]["rules"]
    causes = ", ".join(f"'{c.value}'" for c in RULE_CAUSES)
    rules["x-kubernetes-validations"] = [
        {
            "rule": f"[{causes}].all(c, self.filter(r, c in r.on).size() <= 1)",
            "message": "a cause may be covered by at most one rule",
        }
    ]

    validations: list[Schema] = []
    for name in sorted(p for p in props if p not in SPEC_MUTABLE):
        if name in _IMMUTABLE_REQUIRED:
            rule = f"self.{name} == oldSelf.{name}"
        else:
            rule = (
                f"has(self.{name}) == has(oldSelf.{name}) && "
                f"(!has(self.{name}) || self.{name} == oldSelf.{name})"
            )
        validations.append(
            {"rule": rule, "message": f"{name} is immutable once created", "fieldPath": f".{name}"}
        )
    validations.append(
        {
            "rule": "!has(oldSelf.cancel) || !oldSelf.cancel || (has(self.cancel) && self.cancel)",
            "message": "a cancel cannot be undone",
            "fieldPath": ".cancel",
        }
    )
    validations.append(
        {
            "rule": "!has(oldSelf.retry) || (has(self.retry) && self.retry.count >= oldSelf.retry.count)",
            "message": "retry.count never goes down: raise it to ask for a retry",
            "fieldPath": ".retry",
        }
    )
    for info in _registry.spec_backends():
        name = info.name
        if info.options_required:
            hint = f" ({info.options_hint})" if info.options_hint else ""
            validations.append(
                {
                    "rule": f"self.backend != '{name}' || has(self.{name})",
                    "message": f"{name}{hint} is required when backend is {name}",
                    "fieldPath": f".{name}",
                }
            )
    schema["x-kubernetes-validations"] = validations
    return schema


# ---- status ----------------------------------------------------------------------------------------

CONDITION_SCHEMA: Final[Schema] = {
    "type": "object",
    "description": "A metav1.Condition.",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {
            "type": "string",
            "maxLength": 316,
            "pattern": (
                r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
            ),
        },
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time", "maxLength": DATE_TIME_MAX_LENGTH},
        "reason": {
            "type": "string",
            "minLength": 1,
            "maxLength": 1024,
            "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        },
        "message": {"type": "string", "maxLength": 32768},
    },
}


def status_schema() -> Schema:
    schema = _schema_of(Record, keep_defaults=False)
    props: Schema = schema["properties"]
    del props["job"]
    del props["spec"]
    schema.pop("required", None)  # a refused job's status holds conditions and no record
    props["observedGeneration"] = {
        "type": "integer",
        "format": "int64",
        "minimum": 0,
        "description": OBSERVED_GENERATION_DESCRIPTION,
    }
    props[STATUS_OBSERVED_STATE] = {
        "type": "string",
        "enum": [str(s) for s in State],
        "description": OBSERVED_STATE_DESCRIPTION,
    }
    props[STATUS_OBSERVED_CAUSE] = {
        "type": "string",
        "enum": [str(k) for k in CauseKind if k is not CauseKind.NONE],
        "description": OBSERVED_CAUSE_DESCRIPTION,
    }
    props[STATUS_OBSERVED_NOTE] = {
        "type": "string",
        "maxLength": 1024,
        "description": OBSERVED_NOTE_DESCRIPTION,
    }
    props["conditions"] = {
        "type": "array",
        "maxItems": 16,
        "description": CONDITIONS_DESCRIPTION,
        "items": copy.deepcopy(CONDITION_SCHEMA),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    }
    cost = _schema_of(Cost, keep_defaults=False)
    cost["description"] = COST_DESCRIPTION
    props[STATUS_COST] = cost
    schema["description"] = STATUS_DESCRIPTION
    return schema


# ---- the CRD ---------------------------------------------------------------------------------------


def printer_columns() -> list[Schema]:
    """``kubectl get dj``'s columns: the state status shows, its submission and cause, and Ready with
    its reason (the state again, or why the job is refused: a refused job has no state). ``-o wide``
    adds the backend and the note (why the current object does not run), last: it is a sentence."""
    return [
        {"name": "State", "type": "string", "jsonPath": f".status.{STATUS_OBSERVED_STATE}"},
        {"name": "Submission", "type": "integer", "jsonPath": ".status.submissions[-1:].n"},
        {"name": "Cause", "type": "string", "jsonPath": f".status.{STATUS_OBSERVED_CAUSE}"},
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Backend", "type": "string", "jsonPath": ".spec.backend", "priority": 1},
        {"name": "Note", "type": "string", "jsonPath": f".status.{STATUS_OBSERVED_NOTE}", "priority": 1},
    ]


def crd() -> Schema:
    """The CustomResourceDefinition of DispatchJob (apiextensions.k8s.io/v1)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "dispatch"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": f"A training job supervised by dispatch ({API_VERSION}).",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                            "x-kubernetes-validations": [
                                {
                                    "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                                    "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
                                    "(room for the suffixes of the objects dispatch creates)",
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


# ---- docs/api.md -----------------------------------------------------------------------------------


def _type_of(schema: Schema) -> str:
    kind = str(schema.get("type", "object"))
    if kind == "array":
        return f"[]{_type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map[string]{_type_of(schema['additionalProperties'])}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if schema.get("format") == "date-time":
        return "time"
    return kind


_STRICT: Final = {"≥": ">", "≤": "<"}
"""A bound's sign where the schema excludes the bound itself (``exclusiveMinimum: true``)."""


def _constraints(schema: Schema) -> str:
    parts: list[str] = []
    for key, label in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("maxProperties", "max entries"),
    ):
        if key in schema:
            exclusive = schema.get(f"exclusive{key[0].upper()}{key[1:]}") is True
            parts.append(f"{_STRICT.get(label, label) if exclusive else label} {schema[key]}")
    if "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    if schema.get("x-kubernetes-list-type") == "set":
        parts.append("no duplicates")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _fields(path: str, schema: Schema, rows: list[str]) -> None:
    required = set(schema.get("required", []))
    for name, sub in schema.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        default = f"`{_dump(sub['default'])}`" if "default" in sub else ""
        rows.append(
            f"| `{here}` | {_type_of(sub)} | {'yes' if name in required else ''} | {default} | "
            f"{_cell(_constraints(sub))} | {_cell(str(sub.get('description', '')))} |"
        )
        if sub.get("type") == "object" and "properties" in sub:
            _fields(here, sub, rows)
        items = sub.get("items")
        if sub.get("type") == "array" and isinstance(items, dict) and "properties" in items:
            _fields(f"{here}[]", items, rows)


def _dump(value: Any) -> str:
    import json

    return json.dumps(value, separators=(", ", ": "))


def _table(title: str, path: str, schema: Schema) -> str:
    rows = [
        "| Field | Type | Required | Default | Constraints | Description |",
        "|---|---|---|---|---|---|",
    ]
    _fields(path, schema, rows)
    return f"## {title}\n\n{_cell(str(schema.get('description', '')))}\n\n" + "\n".join(rows) + "\n"


def _rules(title: str, schema: Schema) -> str:
    lines = [f"### {title}\n", "| Field | Rule | Message |", "|---|---|---|"]

    def walk(path: str, node: Schema) -> None:
        for v in node.get("x-kubernetes-validations", []):
            where = path + v.get("fieldPath", "")
            lines.append(f"| `{where}` | `{_cell(v['rule'])}` | {_cell(v['message'])} |")
        for name, sub in node.get("properties", {}).items():
            walk(f"{path}.{name}", sub)
        if isinstance(node.get("items"), dict):
            walk(f"{path}[]", node["items"])

    walk(title, schema)
    return "\n".join(lines) + "\n"


def api_markdown() -> str:
    """docs/api.md: the field reference, from the generated CRD (so from the models' docstrings)."""
    root = crd()["spec"]["versions"][0]
    schema = root["schema"]["openAPIV3Schema"]
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    columns = "\n".join(
        f"| {c['name']} | `{c['jsonPath']}` | {'wide only' if c.get('priority') else ''} |"
        for c in root["additionalPrinterColumns"]
    )
    return (
        "<!-- Generated by hack/gen.py from operator/dispatch/_model.py and _controller/crd.py. "
        "Do not edit. -->\n"
        f"# {KIND} API reference (`{API_VERSION}`)\n\n"
        f"`kubectl get {PLURAL}` (short name `{SHORT_NAME}`, category `{CATEGORY}`). "
        "A job's name is its `metadata.name`; its job id is `<namespace>/<name>`.\n\n"
        "## Printer columns\n\n| Column | JSONPath | |\n|---|---|---|\n"
        + columns
        + "\n\n"
        + _table("spec", "spec", spec)
        + "\n"
        + _table("status", "status", status)
        + "\n## Validation rules (CEL)\n\n"
        + _rules("spec", spec)
        + "\n"
        + _rules("metadata", {"x-kubernetes-validations": schema["x-kubernetes-validations"]})
    )
