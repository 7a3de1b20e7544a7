"""What the aten trace cannot see: which module call fed which, and the SDPA calls made.

An aten-level trace records shapes, not tensor identity, so "these three projections read the
same tensor" or "this attention call asked for head size 72" is lost by then. `observe()` wraps
the tracing call with module forward hooks and a TorchFunctionMode that note, per module call,
the identity of the tensors in and out, and every `scaled_dot_product_attention` call with its
shapes. A tensor's identity is a serial number held in a weak-keyed table: no tensor is kept
alive (a trace on a real device frees activations as usual), and a new tensor at a freed
tensor's address gets a new number.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

_SDPA = torch._C._nn.scaled_dot_product_attention


@dataclass(frozen=True)
class ModuleCall:
    """One forward call of a module: identities (serial numbers) of its tensor inputs
    (positional, in order) and of its tensor outputs."""

    module: str
    module_type: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    input_bytes: int = 0  # bytes of the tensor inputs


@dataclass(frozen=True)
class AttentionCall:
    """One `F.scaled_dot_product_attention` call, by shapes."""

    module: str
    query: tuple[int, ...]  # (B, H, Tq, D)
    key: tuple[int, ...]
    value: tuple[int, ...]
    dtype: str
    has_mask: bool
    dropout_p: float
    is_causal: bool


@dataclass
class Observations:
    calls: list[ModuleCall] = field(default_factory=list)
    attention: list[AttentionCall] = field(default_factory=list)
    packing_checks: int = 0  # transformers' checks for packed sequences (models/hf_masks.py)

    def calls_in(self, parent: str) -> list[ModuleCall]:
        """Calls of the direct children of module `parent`."""
        return [
            c for c in self.calls if c.module.rpartition(".")[0] == parent and c.module != parent
        ]


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


class _Observer(TorchFunctionMode):
    def __init__(self, root: nn.Module, found: Observations) -> None:
        super().__init__()
        self.names = {id(m): name for name, m in root.named_modules()}
        self.found = found
        self.stack: list[str] = [""]
        self.serials = WeakIdKeyDictionary()
        self.counter = itertools.count()

    def identity(self, t: torch.Tensor) -> int:
        serial = self.serials.get(t)
        if serial is None:
            serial = self.serials[t] = next(self.counter)
        return serial

    def pre(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        self.stack.append(name if name is not None else f"{self.stack[-1]}.?")

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        name = self.stack.pop() if len(self.stack) > 1 else ""
        if id(module) not in self.names:
            return
        ins, outs = _tensors(args), _tensors(output)
        self.found.calls.append(
            ModuleCall(
                module=name,
                module_type=type(module).__name__,
                inputs=tuple(self.identity(t) for t in ins),
                outputs=tuple(self.identity(t) for t in outs),
                input_shapes=tuple(tuple(t.shape) for t in ins),
                input_bytes=sum(t.numel() * t.element_size() for t in ins),
            )
        )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            self._note_attention(*args, **kwargs)
        return func(*args, **kwargs)

    def _note_attention(
        self,
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self.found.attention.append(
            AttentionCall(
                module=self.stack[-1],
                query=tuple(query.shape),
                key=tuple(key.shape),
                value=tuple(value.shape),
                dtype=str(query.dtype).removeprefix("torch."),
                has_mask=attn_mask is not None,
                dropout_p=float(dropout_p),
                is_causal=bool(is_causal),
            )
        )


@contextlib.contextmanager
def observe(model: nn.Module) -> Iterator[Observations]:
    """Record module calls and attention calls made inside the block (a model's trace)."""
    found = Observations()
    observer = _Observer(model, found)
    pre = register_module_forward_pre_hook(observer.pre)
    post = register_module_forward_hook(observer.post, always_call=True)
    try:
        with observer:
            yield found
    finally:
        pre.remove()
        post.remove()
