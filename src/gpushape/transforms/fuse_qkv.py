"""fuse-qkv: sibling Linear layers that read the same tensor, merged into one GEMM.

Attention's query/key/value (grouped-query attention's narrower key/value too) and a gated MLP's
gate/up projections each read one tensor: one Linear of width sum(N) reads it once, launches one
GEMM per pass instead of n (a larger grid that fills the SMs) and, in backward, needs no adding
up of n input gradients. Inductor does not merge separate GEMMs of one input by default, so this
still pays under torch.compile. GPT-2's Conv1D `c_attn` is fused already: nothing to do.

Found from the data flow, not from names: the model runs once on the example inputs (on their
device, in eval mode without grad; gpushape's meta trace where the model or the inputs are on
the meta device) with temporary global module hooks noting which tensor each Linear read, and a
TorchFunctionMode noting which tensors derive from which Linear's output. A group is two or more
nn.Linear children of one module that read the very same tensor in every call of it, once per
call; they are fused in the parent's order. The parent keeps its attribute names: each becomes
a `FusedSlice` of one `FusedLinear` (the first slice's child `fused`), whose one weight (and
bias) Parameter holds the originals' rows; the first slice called computes the whole output,
the others take their columns (`_fused_linear.py`: a call with another tensor is computed from
its own rows, never served a stale output). Outputs are views of the fused output (no copy): their
last dimension is contiguous, the row stride the fused one.

Refused whole, with the reason: a sibling Linear of the same module reading a tensor that is
neither computed from the group's outputs nor feeding them (cross-attention: its queries read
the decoder, its keys/values the encoder), a member with hooks, one module held at two places, a
shared Parameter, a subclass or wrapper (LoRA, quantized: anything not exactly nn.Linear), a
member `filter_fn` excludes, members differing in dtype, device, bias or requires_grad, and a
member called more than once per call of its parent.

State dict: the original keys and shapes (`_fused_linear.py`): the original checkpoint loads
with strict=True, the fused model's loads into the original. Optimizer: the fused weights are
new Parameter objects: create the optimizer after `optimize()`. The originals' Parameters are
kept as views of their rows (no second copy of the weights); undo puts the original modules
back, their Parameters holding the current (trained) values and gradients.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from ..tracing.inputs import TensorSpec, model_device_types, split_inputs
from ..tracing.tracer import trace
from ._core import (
    Change,
    Holders,
    Outcome,
    Owners,
    Refusal,
    TransformContext,
    has_hooks,
    module_holders,
    param_owners,
    register_transform,
)
from ._fused_linear import PARTS, FusedLinear, FusedSlice, alias_rows, copy_back, fused_from

ID = "fuse-qkv"
NEW_PARAMETERS = "new Parameter objects: create the optimizer after optimize()"


# ---- the data flow -----------------------------------------------------------------------------
def _linear_like(module: nn.Module) -> bool:
    """A Linear, or a wrapper standing in for one (peft's LoRA `Linear`, GPTQ's `QuantLinear`):
    traced so that a group holding one is refused, not missed."""
    if isinstance(module, (FusedLinear, FusedSlice)):
        return False
    if isinstance(module, nn.Linear):
        return True
    sizes = (getattr(module, a, None) for a in ("in_features", "out_features"))
    return type(module).__name__.endswith("Linear") and all(isinstance(n, int) for n in sizes)


@dataclass(frozen=True)
class _Call:
    parent_call: int
    """How many calls of the parent had begun: the parent call this one belongs to."""
    serial: int | None
    """The input tensor's identity (None: not called with a tensor first)."""
    tags: frozenset[int]
    """id() of the traced Linears whose outputs the input was computed from."""


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


class _Flow(TorchFunctionMode):
    """Per traced Linear, its calls (`_Call`); tensors derived from Linear outputs are tagged."""

    def __init__(self, parent_of: dict[int, int]):
        super().__init__()
        self.parent_of, self.parents = parent_of, set(parent_of.values())
        self.tags, self.serials = WeakIdKeyDictionary(), WeakIdKeyDictionary()
        self.counter = itertools.count()
        self.parent_calls: dict[int, int] = defaultdict(int)
        self.calls: dict[int, list[_Call]] = defaultdict(list)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tags = self._tags_of((args, kwargs))
        if tags:
            self._tag(out, tags)
        return out

    def _tags_of(self, value) -> frozenset[int]:
        return frozenset().union(*(self.tags.get(t, ()) for t in _tensors(value)))

    def _tag(self, value, tags: frozenset[int]) -> None:
        for t in _tensors(value):
            self.tags[t] = self.tags.get(t, frozenset()) | tags

    def _serial(self, t: torch.Tensor) -> int:
        if t not in self.serials:
            self.serials[t] = next(self.counter)
        return self.serials[t]

    def pre(self, module: nn.Module, args) -> None:
        key = id(module)
        if key in self.parents:
            self.parent_calls[key] += 1
        if key in self.parent_of:
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            serial = None if x is None else self._serial(x)
            parent_call = self.parent_calls[self.parent_of[key]]
            self.calls[key].append(_Call(parent_call, serial, self._tags_of(args)))

    def post(self, module: nn.Module, args, output) -> None:
        if id(module) in self.parent_of:
            self._tag(output, frozenset({id(module)}))


def _shape_only(t) -> bool:
    return isinstance(t, TensorSpec) or (isinstance(t, torch.Tensor) and t.is_meta)


def _real(model: nn.Module, inputs: tuple) -> bool:
    shapes_only = any(map(_shape_only, pytree.tree_leaves(inputs)))
    return not shapes_only and "meta" not in model_device_types(model)


def _run(model: nn.Module, inputs: tuple) -> None:
    """One forward: on the inputs' device in eval mode without grad where model and inputs are
    real (data-dependent code runs), else gpushape's meta trace."""
    if not _real(model, inputs):
        trace(model, inputs, train=False)
        return
    args, kwargs = split_inputs(inputs)
    modes = [(m, m.training) for m in model.modules()]
    try:
        with torch.no_grad():
            model.eval()(*args, **kwargs)
    finally:
        for m, training in modes:  # each module's own mode back (a frozen BatchNorm stays)
            m.training = training


def _observe(model: nn.Module, ctx: TransformContext, holders: Holders) -> _Flow:
    """Run the model once (`_run`) recording the traced Linears' calls."""
    parent_of = {
        id(m): id(holders[id(m)][0][0])
        for m in model.modules()
        if _linear_like(m) and holders.get(id(m))
    }
    flow = _Flow(parent_of)
    pre = register_module_forward_pre_hook(flow.pre)
    post = register_module_forward_hook(flow.post)
    try:
        with flow:
            _run(model, ctx.example_inputs)
    finally:
        pre.remove()
        post.remove()
    return flow


# ---- the groups --------------------------------------------------------------------------------
@dataclass
class _Group:
    parent: nn.Module
    fqn: str
    """The parent's name ("" for the root)."""
    names: list[str]
    modules: list[nn.Module]
    calls: list[_Call]
    """The first member's calls (every member's read the same tensors)."""


def _groups(model: nn.Module, flow: _Flow) -> list[_Group]:
    """Children of one module called on the very same tensors in every call, two or more."""
    found: list[_Group] = []
    for fqn, parent in model.named_modules():
        by_inputs: dict[tuple, _Group] = {}
        for name, child in parent._modules.items():
            calls = flow.calls.get(id(child)) if child is not None else None
            if not calls or any(c.serial is None for c in calls):
                continue
            key = tuple((c.parent_call, c.serial) for c in calls)
            group = by_inputs.setdefault(key, _Group(parent, fqn, [], [], calls))
            group.names.append(name)
            group.modules.append(child)
        found += [g for g in by_inputs.values() if len(g.modules) >= 2]
    return found


def _hooked(module: nn.Module) -> bool:
    """Forward/backward hooks, state_dict hooks or gradient hooks on its Parameters."""
    state_hooks = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks")
    params = list(module.parameters(recurse=False))
    return (
        has_hooks(module)
        or any(getattr(module, h, None) for h in (*state_hooks, "_load_state_dict_post_hooks"))
        or any(p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None) for p in params)
    )


def _member_problem(name: str, m: nn.Module, maps: tuple[Owners, Holders]) -> str | None:
    owners, holders = maps
    if type(m) is not nn.Linear:
        cls = f"{type(m).__module__}.{type(m).__qualname__}"
        return f"{name} is a {cls}, not a plain nn.Linear: wrappers (LoRA, quantized) are not fused"
    if len(holders.get(id(m), ())) > 1:
        return f"{name} is one module held at several places: fusing it would change the others"
    if _hooked(m):
        return f"{name} has hooks registered: they would not see the fused call"
    if "forward" in m.__dict__:
        return f"{name}'s forward is replaced on the instance (autocast): fusing would drop it"
    for part in PARTS:
        p = getattr(m, part)
        if p is None:
            continue
        if type(p) is not nn.Parameter or not p.is_floating_point():
            return f"{name}.{part} is not a plain floating-point Parameter ({type(p).__name__})"
        if len(owners.get(id(p), ())) > 1:
            return f"{name}.{part} is shared with another module: fusing would untie it"
    return None


def _kind(m: nn.Linear) -> tuple:
    bias = None if m.bias is None else (m.bias.dtype, m.bias.device, m.bias.requires_grad)
    return (m.in_features, m.weight.dtype, m.weight.device, m.weight.requires_grad, bias)


def _parallel(g: _Group, flow: _Flow) -> list[str]:
    """Sibling Linears reading, in a call of the parent, a tensor neither computed from the
    group's outputs nor feeding its input (cross-attention's query against its keys/values)."""
    members = {id(m) for m in g.modules}
    group_tags: dict[int, frozenset[int]] = {c.parent_call: c.tags for c in g.calls}
    for m in g.modules[1:]:
        for c in flow.calls[id(m)]:
            group_tags[c.parent_call] |= c.tags
    out = []
    for name, child in g.parent._modules.items():
        if child is None or id(child) in members:
            continue
        for c in flow.calls.get(id(child), ()):
            tags = group_tags.get(c.parent_call)
            if tags is not None and not (c.tags & members) and id(child) not in tags:
                out.append(name)
                break
    return out


def _refusal(g: _Group, flow: _Flow, maps: tuple, ctx: TransformContext) -> str | None:
    """Why the group cannot be fused (None: it can)."""
    for name, m in zip(g.names, g.modules, strict=True):
        problem = _member_problem(name, m, maps)
        if problem:
            return problem
        if not ctx.allows(m, f"{g.fqn}.{name}" if g.fqn else name):
            return f"filter_fn excludes {name}: a group is fused whole or not at all"
    if len({m.bias is None for m in g.modules}) > 1:
        return f"{'/'.join(g.names)}: some have a bias and some not"
    if len({_kind(m) for m in g.modules}) > 1:
        return f"{'/'.join(g.names)} differ in in_features, dtype, device or requires_grad"
    if len({c.parent_call for c in g.calls}) < len(g.calls):
        return f"{'/'.join(g.names)} are called more than once per call of their module"
    parallel = _parallel(g, flow)
    if parallel:
        return (
            f"{'/'.join(parallel)} and {'/'.join(g.names)} read different inputs (cross-attention)"
        )
    return None


# ---- the rewrite -------------------------------------------------------------------------------
def _fuse(g: _Group) -> Change:
    fused = fused_from(g.modules, g.names)
    for i, attr in enumerate(g.names):
        setattr(g.parent, attr, FusedSlice(fused, i).train(fused.training))
    alias_rows(g.modules, fused)

    def undo() -> None:
        copy_back(g.modules, fused)
        for attr, m in zip(g.names, g.modules, strict=True):
            setattr(g.parent, attr, m)

    widths = "+".join(str(n) for n in fused.sizes)
    where = f"{g.names[0]}.fused"
    return Change(
        transform=ID,
        module=g.fqn,
        detail=f"{'/'.join(g.names)} -> one Linear {fused.in_features} -> {widths} ({where}); "
        f"state_dict keeps the original keys; {NEW_PARAMETERS}",
        undo=undo,
    )


@register_transform(ID, pays_under_compile=True)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    if sum(map(_linear_like, model.modules())) < 2:
        return out
    maps = (param_owners(model), module_holders(model))
    try:
        flow = _observe(model, ctx, maps[1])
    except Exception as exc:  # a model the trace cannot run: refused loudly, nothing changed
        reason = f"the model could not be traced: {type(exc).__name__}: {exc}".splitlines()[0]
        out.refusals.append(Refusal(transform=ID, module="", reason=reason[:300]))
        return out
    for g in _groups(model, flow):
        reason = _refusal(g, flow, maps, ctx)
        if reason is None:
            out.changes.append(_fuse(g))
        else:
            out.refusals.append(Refusal(transform=ID, module=g.fqn, reason=reason))
    return out
