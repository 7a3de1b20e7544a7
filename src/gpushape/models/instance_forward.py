"""A forward set on one model instance that survives copies and pickles.

Some rewrites replace `model.forward` on the instance (masked-lm-head, no-kv-cache,
skip-attention-mask for a decoder without its cache). A bound method made with
`types.MethodType(fn, model)` deep-copies correctly but does not pickle (pickle looks the
method up on the unpickled object by name, and the class has no such attribute), so
`torch.save(model)` or a spawned worker would fail. `InstanceForward(fn, model)` calls
`fn(model, *args, **kwargs)`; it pickles and deep-copies with its model (a module-level `fn` is
pickled by reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


class InstanceForward:
    def __init__(self, fn: Callable[..., Any], model: nn.Module) -> None:
        self.fn, self.model = fn, model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self.model, *args, **kwargs)


def instance_forward(model: nn.Module) -> Callable[..., Any] | None:
    """The function an `InstanceForward` on `model` calls, else None."""
    forward = model.__dict__.get("forward")
    return forward.fn if isinstance(forward, InstanceForward) else None
