"""Scalar argument checks shared by the ops, the data structures, the planner and the canary object.

Each returns the value as a plain Python ``int``/``bool`` or raises with a ``kv-canary:`` message naming
the argument and the value (SPEC §9).
"""

from __future__ import annotations

import numbers
from typing import Any

from kvcanary.errors import invalid


def check_int(name: str, value: Any) -> int:
    """``value`` as a Python int; bools and non-integers are a ``TypeError``; must fit in int64."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__}")
    v = int(value)
    if not -(1 << 63) <= v < (1 << 63):
        raise invalid(f"{name} must fit in int64, got {v}")
    return v


def check_non_negative(name: str, value: Any) -> int:
    """``value`` as an int (:func:`check_int`) if it is >= 0; else a ``kv-canary:`` ValueError naming ``name``."""
    v = check_int(name, value)
    if v < 0:
        raise invalid(f"{name} must be non-negative, got {v}")
    return v


def check_positive(name: str, value: Any) -> int:
    """An int > 0; anything else is reported as "must be positive" (used for buffer sizes)."""
    v = check_int(name, value)
    if v <= 0:
        raise invalid(f"{name} must be positive, got {v}")
    return v


def check_capacity(name: str, value: Any) -> int:
    """A capacity: a negative value is reported as negative first (SGLang's planner checks), then 0 as
    not positive."""
    return check_positive(name, check_non_negative(name, value))


def check_bool(name: str, value: Any) -> bool:
    """A bool, or an integer (NumPy bools included) equal to 0 or 1."""
    if not isinstance(value, (bool, numbers.Integral)) and type(value).__name__ != "bool_":
        raise TypeError(f"kv-canary: {name} must be a bool, got {value!r}")
    if int(value) not in (0, 1):
        raise TypeError(f"kv-canary: {name} must be a bool, got {value!r}")
    return bool(value)
