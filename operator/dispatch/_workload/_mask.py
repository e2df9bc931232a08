"""The projection compiler: which part of a JSON body the kit keeps (a :data:`Mask`), and how.

The kit caches every object, pod and Event as the part of it that its readers look at, never the
whole body: :func:`project` cuts a decoded body to its mask, :func:`reader` decodes JSON straight
into that part, :func:`merge` joins two masks (a kind's own and the kit's).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, cast

import msgspec

Body = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Clip:
    """A string kept up to ``limit`` characters: one only ever shown cut to that length."""

    limit: int


@dataclass(frozen=True, slots=True)
class Prefixed:
    """A string map (labels, annotations) of which only the keys with these prefixes are kept, keys
    and values shared (``sys.intern``): an object and its pods carry the same ones."""

    prefixes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Shared:
    """A string kept as one shared copy (``sys.intern``) for every cached body: a value many
    objects carry (a condition's type, status and reason, a phase, a node, a namespace); a string
    unique to one object (a name, a uid) is better kept as ``True``, with no entry in the table."""


SHARED: Final = Shared()


@dataclass(frozen=True, slots=True)
class Select:
    """The elements of a list whose ``key`` is one of ``values``, each by ``mask`` (the conditions
    of the types a reader looks up; it looks them up by type, so the others say nothing to it)."""

    key: str
    values: frozenset[str]
    mask: Mask


Mask: TypeAlias = Literal[True] | Clip | Prefixed | Shared | Select | Mapping[str, "Mask"] | tuple["Mask"]
"""Which part of a JSON value the kit caches (:func:`project`): ``True`` the value whole; a mapping
the listed keys of an object, each by its own mask; ``(mask,)`` every element of a list by
``mask``; :class:`Clip`, :class:`Prefixed`, :class:`Shared`, :class:`Select` as they say."""

CONDITION: Final[Mapping[str, Mask]] = {"type": SHARED, "status": SHARED, "reason": SHARED, "message": True}


def conditions(*types: str, mask: Mask = CONDITION) -> Select:
    """``status.conditions`` of these types only, as :func:`true_condition`-style readers see them."""
    return Select("type", frozenset(types), mask)


Projector: TypeAlias = Callable[[Any], Any]

_MISSING: Final = object()
_PROJECTORS: dict[int, tuple[Mask, Projector | None]] = {}
"""Each mask's compiled projector, by the mask's id (the mask kept beside it, so the id is never
reused): the masks are few and live as long as the process (module constants, and one per kind:
``_classify.object_shape`` is cached)."""


def project(value: Any, mask: Mask) -> Any:
    """The part of ``value`` that ``mask`` names (nothing else of ``value`` stays referenced).

    A container of which nothing is left out is ``value`` itself, so projecting a projection again
    returns it unchanged (the informer's store and the kit's cache hold the same objects). A value
    of another type than its mask expects is kept whole: its readers see what they would have
    seen in the whole body. The mask is compiled once into nested closures (:func:`_compile`):
    interpreted, the walk of a mask per value was most of a restart's listing (a pod's projection
    took about as long as decoding the whole pod)."""
    entry = _PROJECTORS.get(id(mask))
    if entry is None or entry[0] is not mask:
        entry = _PROJECTORS[id(mask)] = (mask, _compile(mask))
    compiled = entry[1]
    return value if compiled is None else compiled(value)


def _named(name: Any, values: frozenset[str]) -> bool:
    return type(name) is str and name in values


def _identity(value: Any) -> Any:
    return value


def _compile(mask: Mask) -> Projector | None:
    """``mask`` as a function of the value; None for ``True`` (the value itself: no call)."""
    if mask is True:
        return None
    if isinstance(mask, Clip):
        return _clip(mask.limit)
    if isinstance(mask, Shared):
        return _shared
    if isinstance(mask, Prefixed):
        return _prefixed(mask.prefixes)
    if isinstance(mask, Select):
        return _select(mask)
    if isinstance(mask, tuple):
        return _each(mask[0])
    return _mapping(mask)


def _clip(limit: int) -> Projector:
    def clip(value: Any) -> Any:
        return value[:limit] if type(value) is str else value

    return clip


def _shared(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _prefixed(prefixes: tuple[str, ...]) -> Projector:
    def prefixed(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        kept = {
            sys.intern(k): sys.intern(v) if type(v) is str else v
            for k, v in value.items()
            if k.startswith(prefixes)
        }
        same = len(kept) == len(value) and all(k is sys.intern(k) and kept[k] is v for k, v in value.items())
        return value if same else kept

    return prefixed


def _select(mask: Select) -> Projector:
    key, values = mask.key, mask.values
    item = _compile(mask.mask) or _identity

    def where(value: Any) -> Any:
        if not isinstance(value, list):
            return value
        # Only a string names a wanted element: any other value (even an unhashable one) does not.
        items = [item(i) for i in value if not isinstance(i, dict) or _named(i.get(key), values)]
        same = len(items) == len(value) and all(a is b for a, b in zip(items, value, strict=True))
        return value if same else items

    return where


def _each(mask: Mask) -> Projector | None:
    compiled = _compile(mask)
    if compiled is None:
        return None
    element: Projector = compiled

    def each(value: Any) -> Any:
        if not isinstance(value, list):
            return value
        items = [element(i) for i in value]
        same = all(a is b for a, b in zip(items, value, strict=True))
        return value if same else items

    return each


def _mapping(mask: Mapping[str, Mask]) -> Projector:
    # The mask's own key strings, not the body's: one copy of each key for every cached object.
    fields = tuple((key, _compile(sub)) for key, sub in mask.items())

    def mapping(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        same = True
        for key, sub in fields:
            kept = value.get(key, _MISSING)
            if kept is _MISSING:
                continue
            if sub is not None:
                projected = sub(kept)
                same = same and projected is kept
                kept = projected
            out[key] = kept
        return value if same and len(out) == len(value) else out

    return mapping


Reader: TypeAlias = Callable[[bytes], Body]
"""Decodes one list page's JSON (``{"metadata": ..., "items": [...]}``) or one watch event's
(``{"type": ..., "object": ...}``)."""

_READERS: dict[int, tuple[Mask, Reader]] = {}
"""Each item mask's reader, by the mask's id (kept beside it, as :data:`_PROJECTORS`)."""
_EVENT_METADATA: Final[Mask] = {"metadata": {"resourceVersion": True, "annotations": True}}
"""What a watch reads of every event's object besides its mask: a bookmark's resourceVersion and
the annotation that ends a streamed list's initial events."""


def reader(mask: Mask) -> Reader:
    """A decoder of one list page or watch event that builds, of each object, only what ``mask``
    reaches (and a bookmark's :data:`_EVENT_METADATA`).

    Decoding whole bodies and projecting them was most of a restart's CPU: about 40 us
    per pod, most of it the dicts and strings of everything the projection drops, made and freed.
    The JSON is decoded instead into msgspec Structs made from the mask (:func:`_typed`), which
    skip every other field as they read, and turned back into plain dicts: each object is the
    mask's part of it, of which :func:`project` keeps exactly what it keeps of the whole object
    (clipping, interning, filtering by prefix or key). JSON in which a value has another type than
    its mask expects (a string where an object was expected; an ERROR event's Status) is decoded
    whole instead: :func:`project` keeps such a value whole, so the objects are the same either way.
    """
    entry = _READERS.get(id(mask))
    if entry is None or entry[0] is not mask:
        entry = _READERS[id(mask)] = (mask, _reader(mask))
    return entry[1]


def _reader(mask: Mask) -> Reader:
    names = itertools.count()
    item = _typed(merge(mask, _EVENT_METADATA), names)
    fields = [("metadata", Any), ("items", _list_of(item)), ("type", Any), ("object", item)]
    top = msgspec.defstruct("PageOrEvent", [(name, kind, msgspec.UNSET) for name, kind in fields])
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(top)

    def read(raw: bytes) -> Body:
        try:
            decoded = decoder.decode(raw)
        except msgspec.ValidationError:
            whole: Body = json.loads(raw)
            return whole
        kept: Body = msgspec.to_builtins(decoded)
        return kept

    return read


def _typed(mask: Mask, names: Iterator[int]) -> Any:
    """The msgspec type that decodes a JSON value keeping what ``mask`` reaches of it: ``Any`` for a
    value kept whole (clipped, interned or filtered afterwards by :func:`project`), a Struct of the
    named keys (each unset where the object has none) for a mapping, a list for a tuple or a
    :class:`Select` (its elements' key kept too: it chooses them)."""
    if mask is True or isinstance(mask, Clip | Shared | Prefixed):
        return Any
    if isinstance(mask, Select):
        inner = mask.mask
        if not isinstance(inner, Mapping):
            return Any
        return _list_of(_typed({mask.key: True, **inner}, names))
    if isinstance(mask, tuple):
        element = _typed(mask[0], names)
        return Any if element is Any else _list_of(element)
    keys = list(mask)
    struct = msgspec.defstruct(
        f"Kept{next(names)}",
        [(f"f{i}", _typed(mask[key], names), msgspec.UNSET) for i, key in enumerate(keys)],
        rename={f"f{i}": key for i, key in enumerate(keys)},
    )
    return struct | None


def _list_of(element: Any) -> Any:
    """``list[element] | None``, made at run time."""
    return cast(Any, list)[element] | None


def merge(a: Mask, b: Mask) -> Mask:
    """Both masks' fields (a mapping's keys from either; ``True`` wins over any part)."""
    if a is True or b is True:
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out: dict[str, Mask] = dict(a)
        for key, sub in b.items():
            out[key] = merge(out[key], sub) if key in out else sub
        return out
    if isinstance(a, tuple) and isinstance(b, tuple):
        return (merge(a[0], b[0]),)
    if isinstance(a, Select) and isinstance(b, Select) and a.key == b.key:
        return Select(a.key, a.values | b.values, merge(a.mask, b.mask))
    if a == b:
        return a
    raise ValueError(f"masks {a!r} and {b!r} cannot be merged")
