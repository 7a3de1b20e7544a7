"""A bounded cache of launch plans, keyed by a call's signature.

The kernel families work out everything that follows from a call's shapes, strides, dtypes and
device (the view, tiles, grid, constexprs, the compiled launcher) once, and keep it as a plan:
building one costs host time that a call would otherwise pay every time, and for small kernels
that Python costs more than the kernel's GPU time (`batch_norm/_launch.py`). A network calls an
op with few signatures (a handful of shapes per layer type), so after its first steps every
call finds its plan here and only allocates its outputs and launches.

The bound keeps a program that sees many signatures (varying sequence lengths, image sizes,
a sweep over shapes) from growing the cache without limit. When full, the cache is cleared
at the next miss rather than evicting one entry: a workload that fits keeps all its plans, one
that does not rebuilds what it uses again, and the lookup stays a dict lookup. A cache built
with `max_plans=None` is unbounded.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

P = TypeVar("P")

_MISSING = object()


class PlanCache(Generic[P]):
    """Plans by key, at most `max_plans` of them (None: no bound)."""

    __slots__ = ("_plans", "max_plans")

    def __init__(self, max_plans: int | None) -> None:
        if max_plans is not None and max_plans < 1:
            raise ValueError(f"max_plans must be at least 1 (or None), got {max_plans}")
        self.max_plans = max_plans
        self._plans: dict[Hashable, P] = {}

    def get(self, key: Hashable, build: Callable[..., P], *args) -> P:
        """The plan cached under `key`; on a miss `build(*args)`, called once, stored and
        returned (the cache cleared first when it holds `max_plans`). A build that raises
        leaves the cache as it was. `args` spare the caller a closure on the hot path."""
        plan = self._plans.get(key, _MISSING)
        if plan is _MISSING:
            plan = build(*args)
            if self.max_plans is not None and len(self._plans) >= self.max_plans:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._plans
