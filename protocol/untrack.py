"""Taking long-lived immutable values out of the cyclic collector's reach.

A full pass of Python's cyclic collector walks every object it tracks, and
stops the event loop while it does (issue #42 section 1). Under 100 busy
sessions most of what it walked was the runtime's caches of transcript
messages (:class:`~protocol.lru.ByteLRU` values): the decoded messages, their
``MessageTime``/``Tokens``/parts, and their converted ``ChatMessage``\\ s, about
twenty objects a step, growing with the sessions' histories: 42,000 objects
and an 11 ms pass (CPU) after 100 sessions x 20 prompts, where the target for
any one callback is 5 ms.

None of those can be in a reference cycle: they are frozen attrs instances
and tuples, built bottom-up from atoms (``str``, ``int``, ...) and from each
other. CPython itself stops tracking such objects when it can tell (a tuple
of atoms, a dict of atoms); it cannot tell for an instance of a class.
:func:`untrack` does it for them, through CPython's public
``PyObject_GC_UnTrack``, under the same rule CPython applies to tuples: an
object leaves the collector only when everything it refers to is an atom or
has left it already, so no cycle can pass through it. A mutable container
(a list, a dict holding a list) keeps it, and what refers to it, tracked.

The one way to leak through this: putting an untracked value inside one of
its own (untracked, atom-only) dicts later, making a cycle the collector
cannot see. Values kept in caches are never changed, so none does that.

A cache's dict holding such values is still walked, entry by entry, on every
full pass (20,000 entries in each of three caches: a 15-30 ms pass, tracked
objects or not). :func:`untrack_dict` takes such a dict out too; CPython puts
a dict back in the collector's care by itself whenever a value that may be
tracked is stored in it, so the owner calls it again after each store, while
it knows every value is untracked.

Freed objects go by reference counting as before; only cycles need the
collector, and these have none. On an interpreter other than CPython nothing
is untracked.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Callable, Iterable
from itertools import islice
from operator import attrgetter
from typing import Any, Final

import attrs

__all__ = ["untrack", "untrack_dict", "untrack_known", "untrack_tail", "untracked_tuple"]

#: How deep :func:`untrack` follows nested values (transcript values are 3-4 deep).
MAX_DEPTH: Final = 16


@attrs.frozen
class _Probe:
    pass


_FROZEN_SETATTR: Final = _Probe.__setattr__

_untrack: Callable[[object], None] | None = None
if sys.implementation.name == "cpython":
    _untrack = ctypes.pythonapi.PyObject_GC_UnTrack
    _untrack.argtypes = (ctypes.py_object,)
    _untrack.restype = None

_is_tracked: Final = gc.is_tracked

#: Per class: a getter of all its fields' values when it is a frozen, slotted
#: attrs class (no ``__dict__`` to hold anything else), else None. Bounded by
#: the number of classes whose instances are cached (a handful).
_FIELDS: dict[type, Callable[[Any], tuple[Any, ...]] | None] = {}


def _fields_of(kind: type) -> Callable[[Any], tuple[Any, ...]] | None:
    try:
        return _FIELDS[kind]
    except KeyError:
        pass
    getter: Callable[[Any], tuple[Any, ...]] | None = None
    if attrs.has(kind) and kind.__setattr__ is _FROZEN_SETATTR and kind.__dictoffset__ == 0:
        names = [f.name for f in attrs.fields(kind)]
        if len(names) == 1:
            one = attrgetter(names[0])
            getter = lambda value: (one(value),)  # noqa: E731
        elif names:
            getter = attrgetter(*names)
        else:
            getter = lambda value: ()  # noqa: E731
    _FIELDS[kind] = getter
    return getter


def untrack(value: object, _depth: int = 0) -> bool:
    """Take ``value`` and what it holds out of the cyclic collector, where that is safe.

    Returns whether ``value`` is untracked now (an atom always is). Exact tuples
    and frozensets, and instances of frozen slotted attrs classes, are untracked
    when all they hold is; anything else (a list, a dict holding a list, a
    mutable instance) stays tracked, and so does what holds it.
    """
    if not _is_tracked(value):
        return True
    if _untrack is None or _depth >= MAX_DEPTH:
        return False
    kind = type(value)
    children: Any
    if kind is tuple or kind is frozenset:
        children = value
    else:
        fields = _fields_of(kind)
        if fields is None:
            return False
        children = fields(value)
    ok = True
    # Only the children still tracked, picked in C: a step's history tuple of
    # 400 messages untracked already costs a pass over it, not 400 calls.
    for child in filter(_is_tracked, children):
        # On, even when one is not: each one untracked is one less to walk.
        ok = untrack(child, _depth + 1) and ok
    if ok:
        _untrack(value)
    return ok


def untrack_dict(mapping: dict[Any, Any]) -> None:
    """Take ``mapping`` out of the cyclic collector: on the caller's word that every
    key and value in it is an atom or untracked (checking would be a walk of it all).

    CPython tracks the dict again as soon as a value of a container type is stored
    in it (untracked or not), so this is for after each store.
    """
    if _untrack is not None and gc.is_tracked(mapping):
        _untrack(mapping)


def untrack_known(value: tuple[Any, ...] | frozenset[Any]) -> None:
    """Take out an exact tuple or frozenset on the caller's word that all it holds is
    atoms or untracked (it knows from how it built it: a tuple of ints, the
    messages of a history whose dict is untracked), without a walk of it.

    A step re-puts its session's whole history (4,000 messages: seven such tuples
    walked item by item cost 0.2 ms of a 3 ms turn).
    """
    if _untrack is not None and _is_tracked(value):
        _untrack(value)


def untracked_tuple(values: Iterable[Any]) -> tuple[Any, ...]:
    """``tuple(values)``, taken out at once by :func:`untrack_known`: on the caller's
    word that every value is an atom or untracked (ints, seqs, sums)."""
    result = tuple(values)
    untrack_known(result)
    return result


def untrack_tail(items: tuple[Any, ...], known: int) -> bool:
    """:func:`untrack` for a tuple whose first ``known`` items the caller knows are
    untracked (a history's unchanged prefix): only the rest is walked."""
    if not _is_tracked(items):
        return True
    if _untrack is None:
        return False
    ok = True
    for child in filter(_is_tracked, islice(items, known, None)):
        ok = untrack(child, 1) and ok
    if ok:
        _untrack(items)
    return ok
