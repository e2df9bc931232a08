"""What a rule's change does to the spec: pure functions of the spec and the record.

A firing of a rule with a ``change`` authorizes a submission that runs with the previous
submission's spec changed once (:func:`changed`): ``memory`` multiplies the memory of each node by
its factor, up to its max and never down; the other fields replace. The spec of submission N is
therefore the job's spec with the changes of the rules that authorized submissions 2..N applied in
that order (:func:`effective_spec`), which the record holds (each submission's ``rule``): a
restarted operator, ``kubectl dispatch`` and ``plan --simulate`` compute exactly the spec the
supervisor built the object from (:func:`spec_for`). A submission authorized without a rule (the
first, a person's) changes nothing and keeps what the earlier firings changed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction

from ._model import (
    Change,
    FieldChange,
    JobSpec,
    MemoryChange,
    OptionsModel,
    Record,
    TimeLimitChange,
    quantity_bytes,
)


def more_memory(now: int, memory: MemoryChange) -> int:
    """The memory (bytes) one firing gives a submission whose predecessor had ``now``: ``now`` times
    the factor (exactly, rounded down), at most the max, never less than ``now``."""
    grown = math.floor(now * Fraction(str(memory.factor)))
    return max(now, min(quantity_bytes(memory.max), grown))


def longer_limit(now: int, limit: TimeLimitChange) -> int:
    """The time limit (seconds) one firing gives a submission whose predecessor had ``now``."""
    grown = math.floor(now * Fraction(str(limit.factor)))
    return max(now, min(limit.max_seconds, grown))


def changed(spec: JobSpec, change: Change) -> JobSpec:
    """``spec`` changed once by ``change``: the spec of the submission a firing authorizes, given
    the spec of the one before it."""
    update: dict[str, object] = {}
    if change.queue is not None:
        update["queue"] = change.queue
    if change.workload_priority_class is not None:
        update["workload_priority_class"] = change.workload_priority_class
    if change.time_limit is not None and spec.time_limit_seconds is not None:
        longer = longer_limit(spec.time_limit_seconds, change.time_limit)
        if longer != spec.time_limit_seconds:
            update["time_limit_seconds"] = longer
    options: dict[str, OptionsModel] = dict(spec.options)
    if change.memory is not None:
        for name, held in spec.options.items():
            now = held.memory_bytes()
            grown = more_memory(now, change.memory) if now is not None else now
            if grown != now and grown is not None:  # at the max already: the field stays as written
                options[name] = held.with_memory_bytes(grown)
    for name, own in change.options.items():
        base = options.get(name) or own.options_model()
        values = {f: v for f in own.model_fields_set if (v := getattr(own, f)) is not None}
        options[name] = base.model_copy(update=values)
    if options != spec.options:
        update["options"] = options
    return spec.model_copy(update=update) if update else spec


def effective_spec(spec: JobSpec, rules: Sequence[int | None]) -> JobSpec:
    """The spec a submission runs with when ``rules`` authorized the submissions after the first,
    in order (None: authorized without a rule, which changes nothing)."""
    current = spec
    for index in rules:
        if index is None or index >= len(spec.recovery.rules):
            continue
        change = spec.recovery.rules[index].change
        if change is not None:
            current = changed(current, change)
    return current


def has_changes(spec: JobSpec) -> bool:
    return any(rule.change is not None for rule in spec.recovery.rules)


def spec_for(record: Record, n: int) -> JobSpec:
    """The spec submission ``n`` of ``record`` runs with (its object is built from it), computed
    from the record alone: the job's spec and the rules that authorized submissions 2..n."""
    if not has_changes(record.spec):
        return record.spec
    return effective_spec(record.spec, [s.rule for s in record.submissions[1:n]])


def field_changes(before: JobSpec, after: JobSpec) -> tuple[FieldChange, ...]:
    """Each field of ``after`` that differs from ``before``, by its path on the wire."""
    old, new = dict(_leaves(before)), dict(_leaves(after))
    return tuple(
        FieldChange(field=path, from_=old.get(path), to=new.get(path))
        for path in sorted(old.keys() | new.keys())
        if old.get(path) != new.get(path)
    )


def _leaves(spec: JobSpec) -> Iterator[tuple[str, str]]:
    """The spec's fields a change can touch (all but the rules and the command), flattened to
    ``spec.<path>``: value, each backend's options as ``spec.<backend>``."""
    wire: dict[str, object] = spec.model_dump(
        mode="json", by_alias=True, exclude_none=True, exclude={"name", "command", "recovery", "options"}
    )
    for name, options in spec.options.items():
        wire[name] = options.model_dump(mode="json", by_alias=True, exclude_none=True)
    yield from _flat(wire, "spec")


def _flat(node: Mapping[str, object], path: str) -> Iterator[tuple[str, str]]:
    for key, value in node.items():
        where = f"{path}.{key}"
        if isinstance(value, Mapping) and value:
            yield from _flat(value, where)
        else:
            yield where, value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def next_changes(record: Record, rule: int) -> tuple[FieldChange, ...]:
    """What the firing of ``rule`` that authorizes the next submission of ``record`` changes."""
    rules = record.spec.recovery.rules
    change = rules[rule].change if rule < len(rules) else None
    if change is None:
        return ()
    before = spec_for(record, len(record.submissions))
    return field_changes(before, changed(before, change))


def describe(change: Change) -> str:
    """A change in a user's words, as the plan and ``kubectl dispatch`` show it."""
    parts: list[str] = []
    if change.memory is not None:
        parts.append(f"memory x{change.memory.factor:g} per firing, at most {change.memory.max}")
    if change.time_limit is not None:
        limit = change.time_limit
        parts.append(f"timeLimitSeconds x{limit.factor:g} per firing, at most {limit.max_seconds}")
    if change.queue is not None:
        parts.append(f"queue {change.queue}")
    if change.workload_priority_class is not None:
        parts.append(f"workloadPriorityClass {change.workload_priority_class}")
    for name, own in sorted(change.options.items()):
        for key, value in own.model_dump(mode="json", by_alias=True, exclude_none=True).items():
            parts.append(f"{name}.{key} {value}")
    return "; ".join(parts)
