"""Validated views of long-lived objects, reused while nothing under them changed (:class:`ValidatedCache`)."""

from __future__ import annotations

from typing import Any

from kvcanary.ops.validation.arrays import TENSOR_TYPE

_UNCACHEABLE = object()


def _same_signature(sig: tuple, arrays: tuple) -> bool:
    """Whether ``arrays`` still have the signatures ``sig`` (of :func:`tensor_signature`), compared array by
    array without building new tuples (the SGLang-named ops check a context's and a plan's on every call)."""
    if len(sig) != len(arrays):
        return False
    for s, a in zip(sig, arrays):
        if a is None:
            if s != ():
                return False
        elif (type(a) is not TENSOR_TYPE or not s or a.data_ptr() != s[0] or a.shape != s[1]
              or a.stride() != s[2] or a.dtype is not s[3] or a.get_device() != s[4]):
            return False
    return True


def tensor_signature(x: Any) -> Any:
    """What a validated view of ``x`` depends on that can change in place: a torch tensor's address, shape,
    strides, dtype and device index (``set_``, ``resize_`` and ``.data =`` change them); ``()`` for an absent
    optional array; a marker that disables caching for anything else."""
    if x is None:
        return ()
    if type(x).__name__ != "Tensor":
        return _UNCACHEABLE
    return (x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device())


class ValidatedCache:
    """Validated views of long-lived objects (contexts, plans, a canary's tables), reused while nothing under them
    changed.

    The SGLang-named ops receive the same context and plan objects every step; re-deriving their views is most
    of an op's host time. An entry is reused only for the *same* object (kept alive by the entry, so its id is
    not recycled) whose arrays all still have the signature (:func:`tensor_signature`) they were validated
    with; the objects are frozen, so nothing else can change. Anything not a plain torch tensor is validated on
    every call.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._entries: dict[tuple[int, str], tuple[Any, tuple, Any]] = {}

    def hit(self, obj: Any, arrays: Any, name: str = "") -> Any:
        """The views kept for this very ``obj`` if ``arrays(obj)`` (called only when there is an entry) still have
        their signatures, else None: the fast path for callers whose argument checks are needed only on a miss
        (the objects are frozen, so the same object holds the same, already checked, fields)."""
        entry = self._entries.get((id(obj), name))
        if entry is not None and entry[0] is obj and _same_signature(entry[1], arrays(obj)):
            return entry[2]
        return None

    def holds(self, obj: Any, views: Any, name: str = "") -> bool:
        """Whether ``views`` are the ones kept for ``obj`` (a later call with ``obj`` may return them again)."""
        entry = self._entries.get((id(obj), name))
        return entry is not None and entry[0] is obj and entry[2] is views

    def get(self, obj: Any, arrays: tuple, build: Any, name: str = "") -> Any:
        """The views ``build()`` returns for ``obj`` (validated under ``name``, which their messages use)."""
        views = self.hit(obj, lambda _obj: arrays, name)
        if views is not None:
            return views
        sig = tuple(tensor_signature(a) for a in arrays)
        views = build()
        if _UNCACHEABLE not in sig:
            if len(self._entries) >= self.capacity:
                self._entries.pop(next(iter(self._entries)))
            self._entries[(id(obj), name)] = (obj, sig, views)
        return views
