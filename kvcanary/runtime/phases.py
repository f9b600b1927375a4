"""Phase order of a :class:`~kvcanary.KVCanary`: HEAD before TAIL in every forward.

A forward is ``step("head")``, the model forward, ``step("tail")``. A TAIL without its HEAD would stamp
tokens whose prefix was never verified; a second HEAD before the TAIL usually means a forward was retried or
skipped after the HEAD ran, so its records describe tokens whose KV was never written. Both are engine bugs of
their own, so they raise at once with a ``kv-canary:`` error.

Nested forwards (a vision-language model that runs an inner forward while an outer one is open, or
context-parallel ranks that run a partial forward inside the engine step) open one more level inside
:meth:`PhaseOrder.nested` (``with canary.nested_forward(): ...``); each level still needs HEAD before TAIL. A
forward abandoned after its HEAD (an exception in the model) is closed with :meth:`PhaseOrder.abort`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kvcanary.errors import invalid


class PhaseOrder:
    """Tracks open forwards: a HEAD opens one, a TAIL closes the innermost; at most ``depth_limit`` may be open
    at once (1, plus one per active :meth:`nested` block). :meth:`check` before a step, :meth:`commit` after it,
    so a step that raised leaves the order as it was."""

    def __init__(self, name: str = "kv") -> None:
        self.name = name
        self.open = 0
        self.depth_limit = 1

    def check(self, phase: str) -> None:
        """Raise if ``phase`` (``"head"`` or ``"tail"``) may not run now; changes nothing."""
        if phase == "head" and self.open >= self.depth_limit:
            raise invalid(
                f"KVCanary {self.name!r}: step('head') called twice without step('tail') in between (phase order is "
                f"HEAD, forward, TAIL; {self.open} forward(s) open). For a forward nested inside another use "
                f"`with canary.nested_forward():`; after a failed forward call canary.abort_forward()")
        if phase == "tail" and self.open == 0:
            raise invalid(f"KVCanary {self.name!r}: step('tail') called without a step('head') before it "
                          f"(phase order is HEAD, forward, TAIL)")

    def commit(self, phase: str) -> None:
        """Record that ``phase`` ran (after :meth:`check`)."""
        self.open += 1 if phase == "head" else -1

    def abort(self) -> None:
        """Forget the innermost open forward (its HEAD ran, its TAIL never will)."""
        self.open = max(0, self.open - 1)

    @contextlib.contextmanager
    def nested(self) -> Iterator[None]:
        """Allow one more open forward inside the block (an inner forward within an outer one)."""
        self.depth_limit += 1
        try:
            yield
        finally:
            self.depth_limit -= 1
