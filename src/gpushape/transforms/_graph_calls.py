"""graph-layers' view of a model: which layers repeat (`layer_stacks`), what each is called with
in one forward (`observe`: the argument structure, the tensors' shapes, strides, dtypes and
requires_grad, every other argument's value), and sample inputs like those to capture with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

MIN_LAYERS = 2

TENSOR = object()  # where a tensor leaf is, among a call's constants


@dataclass
class Call:
    """What one layer was called with: the argument structure and its non-tensor leaves, and
    each tensor leaf's `meta` (shape, strides, dtype, device, requires_grad)."""

    spec: Any
    constants: list  # TENSOR where the leaf is a tensor
    tensors: list[tuple]
    # per tensor leaf: (layer, output index) where it is the very tensor an observed layer
    # returned (graph-layers then reads that output's buffer in place), else None
    sources: list = field(default_factory=list)

    @classmethod
    def of(cls, args: tuple, kwargs: dict) -> Call:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors = [meta(t) for t in leaves if isinstance(t, torch.Tensor)]
        constants = [TENSOR if isinstance(t, torch.Tensor) else t for t in leaves]
        return cls(spec, constants, tensors)


PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)


def plain(value: Any) -> bool:
    """A non-tensor argument a replay can stand for: a value compared by equality (None, a
    flag, a number, a string, a dtype), or the tensor marker."""
    return value is TENSOR or type(value) in PLAIN


def meta(t: torch.Tensor) -> tuple:
    """What a graph input fixes: shape, strides (a channels_last input stays channels_last in
    the graph), dtype, device, requires_grad."""
    return (t.shape, t.stride(), t.dtype, t.device, t.requires_grad)


def _kind(m: nn.Module) -> type:
    """A layer's class; every torch.fx GraphModule (a block fuse-norm-act rewrote: torch.fx
    makes a class per instance) counts as one kind."""
    return fx.GraphModule if isinstance(m, fx.GraphModule) else type(m)


def layer_stacks(model: nn.Module) -> list[tuple[str, list[tuple[str, nn.Module]]]]:
    """(container name, [(layer name, layer)]) for each ModuleList / Sequential holding two or
    more children of one class (the repeated blocks of a transformer, the stages of a convnet;
    blocks rewritten by torch.fx count as one class)."""
    stacks = []
    for name, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) < MIN_LAYERS:
            continue
        children = list(m.named_children())
        kinds = {_kind(c) for _, c in children}
        if (
            name
            and len(kinds) == 1
            and not isinstance(children[0][1], (nn.ModuleList, nn.Sequential))
        ):
            stacks.append((name, [(f"{name}.{n}", c) for n, c in children]))
    # a stack inside another stack's layer is graphed with it
    return [s for s in stacks if not any(s[0].startswith(o[0] + ".") for o in stacks)]


def observe(model: nn.Module, layers: dict[str, nn.Module], inputs: tuple) -> dict[str, list]:
    """Each layer's calls in one forward of the model (train mode, autograd on), with where each
    tensor argument came from: the output of a layer called before it, or elsewhere. The
    outputs are held until the forward ends, so an address is never another tensor's."""
    calls: dict[str, list] = {name: [] for name in layers}
    made: dict[int, tuple[str, int, torch.Tensor]] = {}  # id(output) -> (layer, index, output)

    def before(_m, args, kwargs, name):
        call = Call.of(args, kwargs)
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                seen = made.get(id(t))
                call.sources.append(seen[:2] if seen is not None and seen[2] is t else None)
        calls[name].append(call)

    def after(_m, _args, _kwargs, out, name):
        tensors = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        for i, t in enumerate(tensors):
            made[id(t)] = (name, i, t)

    handles = []
    for name, layer in layers.items():
        handles.append(
            layer.register_forward_pre_hook(
                lambda m, a, k, name=name: before(m, a, k, name), with_kwargs=True
            )
        )
        handles.append(
            layer.register_forward_hook(
                lambda m, a, k, o, name=name: after(m, a, k, o, name), with_kwargs=True
            )
        )
    try:
        with torch.enable_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
        made.clear()
    return calls


def sample(call: Call) -> tuple[torch.Tensor, ...]:
    """Inputs to capture with: the shapes, strides and dtypes the layer was called with."""
    out = []
    for shape, stride, dtype, device, grad in call.tensors:
        t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        if dtype.is_floating_point:
            t.normal_()
        else:
            t.zero_()
        out.append(t.requires_grad_(grad))
    return tuple(out)
