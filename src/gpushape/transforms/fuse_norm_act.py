"""fuse-norm-act: a normalization and the activation after it (and a residual add between
them) become one of gpushape's fused kernels, found from the data flow.

Patterns, in the forward of the module that calls the norm (its parent):
- BatchNorm2d -> ReLU                    -> BatchNormAct2d(activation="relu")
- BatchNorm2d -> add(., residual) -> ReLU -> BatchNormAct2d(activation="relu"), residual passed in
- LayerNorm   -> GELU                    -> LayerNormGELU (same approximation)
- add(a, b)   -> LayerNorm                -> AddLayerNorm(a, b), which also returns the sum for
  its other users (BERT's `LayerNorm(hidden + input)`, a pre-norm block's residual stream)
The ReLU or GELU may be a module, `F.relu`/`torch.relu`/`F.gelu` or the tensor method; the add
may be `+`, `+=` or `torch.add`. The data flow comes from torch.fx: the parent is traced with
its children as leaves, so the graph shows which call's output feeds which. A site is fused
only when the norm's output (and the sum's) has no other user, the norm module is called once,
and no hook is registered on the parent or the norm; otherwise it is refused with the reason.
A parent whose forward is replaced on the instance (autocast-bf16's wrapper, a checkpoint) is
refused too: torch.fx traces the class's forward, and the rewrite would drop the replacement.

The fused modules share the norm's parameters and buffers (same objects, same names), so the
state_dict, its keys and the optimizer's state are unchanged. A rewritten parent becomes an
fx.GraphModule holding the same children under the same names; undo puts the original back.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..kernels import AddLayerNorm, BatchNormAct2d, LayerNormGELU
from ._core import (
    Change,
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    parent_of,
    register_transform,
)

ID = "fuse-norm-act"
RELU = {F.relu, torch.relu, "relu", "relu_"}
GELU = {F.gelu, "gelu"}
ADD = {operator.add, operator.iadd, torch.add, "add", "add_"}


class _ChildrenAsLeaves(fx.Tracer):
    """Trace one module's own forward: every child is a leaf call."""

    def __init__(self, root: nn.Module):
        super().__init__()
        self.children = {id(m) for m in root.children()}

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return id(m) in self.children or super().is_leaf_module(m, qualname)


def _callee(node: fx.Node, module: nn.Module):
    """What a call node calls: the module, the function, or the method name."""
    if node.op == "call_module":
        return module.get_submodule(node.target)
    if node.op in ("call_function", "call_method"):
        return node.target
    return None


def _is_act(node: fx.Node, module: nn.Module, kind: str) -> bool:
    callee = _callee(node, module)
    if kind == "relu":
        return isinstance(callee, nn.ReLU) or callee in RELU
    approximate = node.kwargs.get("approximate", "none")
    return (isinstance(callee, nn.GELU) or callee in GELU) and approximate in ("none", "tanh")


def _gelu_approximate(node: fx.Node, module: nn.Module) -> str:
    callee = _callee(node, module)
    return (
        callee.approximate
        if isinstance(callee, nn.GELU)
        else node.kwargs.get("approximate", "none")
    )


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _residual_add(node: fx.Node, module: nn.Module) -> tuple[fx.Node, fx.Node] | None:
    """(add node, the other operand) when `node`'s only user adds another tensor to it."""
    add = _only_user(node)
    if add is None or _callee(add, module) not in ADD or add.kwargs.get("alpha", 1) != 1:
        return None
    if len(add.args) != 2 or node not in add.args:
        return None
    other = add.args[1] if add.args[0] is node else add.args[0]
    return (add, other) if isinstance(other, fx.Node) and other is not node else None


def _summed(node: fx.Node, module: nn.Module) -> fx.Node | None:
    """The add node when the norm's only input is the sum of two tensors a + b."""
    if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], fx.Node):
        return None
    add = node.args[0]
    if _callee(add, module) not in ADD or add.kwargs or len(add.args) != 2:
        return None
    a, b = add.args
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)) or a is b:
        return None
    if _callee(add, module) in (operator.iadd, "add_"):
        return None  # in place: `a` itself changes, and other nodes may read it as the sum
    return add


def _sites(parent: nn.Module, graph: fx.Graph) -> list[dict]:
    """Norm call sites in `graph` and the nodes a fused kernel replaces."""
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    sites = []
    for node in graph.nodes:
        norm = _callee(node, parent) if node.op == "call_module" else None
        if type(norm) is nn.BatchNorm2d:
            kind = "relu"
        elif type(norm) is nn.LayerNorm:
            kind = "gelu"
        else:
            continue
        site = {"node": node, "norm": norm, "kind": kind, "calls": calls[node.target]}
        user = _only_user(node)
        residual = _residual_add(node, parent) if kind == "relu" else None
        if residual is not None and _only_user(residual[0]) is not None:
            act = _only_user(residual[0])
            if _is_act(act, parent, kind):
                sites.append({**site, "add": residual[0], "residual": residual[1], "act": act})
                continue
        if user is not None and _is_act(user, parent, kind):
            sites.append({**site, "act": user})
        elif kind == "gelu" and _summed(node, parent) is not None:
            sites.append({**site, "kind": "add_ln", "add": _summed(node, parent)})
        elif any(_is_act(u, parent, kind) for u in node.users):
            sites.append(
                {
                    **site,
                    "refuse": "the norm's output has other users besides the "
                    "activation: fusing would lose the intermediate they read",
                }
            )
    return sites


def _fused(site: dict, parent: nn.Module) -> nn.Module:
    norm = site["norm"]
    if site["kind"] == "relu":
        return BatchNormAct2d.from_batchnorm(norm, "relu")
    cls = AddLayerNorm if site["kind"] == "add_ln" else LayerNormGELU
    fused = cls.__new__(cls)
    nn.Module.__init__(fused)
    fused.normalized_shape, fused.eps = tuple(norm.normalized_shape), norm.eps
    fused.elementwise_affine = norm.elementwise_affine
    if cls is LayerNormGELU:
        fused.approximate = _gelu_approximate(site["act"], parent)
    fused.weight, fused.bias = norm.weight, norm.bias  # the same Parameters
    return fused


def _rewrite(site: dict, parent: nn.Module, graph: fx.Graph) -> None:
    node = site["node"]
    if site["kind"] == "add_ln":  # one call computes both: y for the norm's users, s for the sum's
        add = site["add"]
        with graph.inserting_before(add):
            # the add's operands as they are now (an earlier rewrite may have replaced one)
            both = graph.call_module(node.target, args=tuple(add.args))
            y = graph.call_function(operator.getitem, (both, 0))
            total = graph.call_function(operator.getitem, (both, 1))
        node.replace_all_uses_with(y)
        graph.erase_node(node)
        add.replace_all_uses_with(total)
        graph.erase_node(add)
        return
    act = site["act"]
    if "residual" in site:
        # The residual may be computed after the norm (torchvision's Bottleneck runs its
        # downsample last): the norm moves down to the add, after both of its inputs.
        site["add"].prepend(node)
        node.args = (*node.args, site["residual"])
        act.replace_all_uses_with(node)
        graph.erase_node(act)
        graph.erase_node(site["add"])
    else:
        act.replace_all_uses_with(node)
        graph.erase_node(act)


def _keep_order(rewritten: nn.Module, parent: nn.Module) -> None:
    """Children, parameters and buffers in the parent's order (GraphModule registers them in
    the order the graph uses them), so the state_dict lists its keys as before."""
    for attr in ("_modules", "_parameters", "_buffers"):
        mine, theirs = getattr(rewritten, attr), getattr(parent, attr)
        order = [k for k in theirs if k in mine] + [k for k in mine if k not in theirs]
        setattr(rewritten, attr, {k: mine[k] for k in order})


def _refusal(fqn: str, reason: str) -> Refusal:
    return Refusal(transform=ID, module=fqn, reason=reason)


def _fuse_in(parent: nn.Module, fqn: str, ctx: TransformContext, out: Outcome) -> nn.Module | None:
    """The rewritten parent (a GraphModule) or None when nothing there was fused."""
    try:
        graph = _ChildrenAsLeaves(parent).trace(parent)
    except Exception as exc:  # FX cannot trace data-dependent control flow: refuse, say why
        reason = f"torch.fx cannot trace its forward ({type(exc).__name__}: {exc})".split("\n")[0]
        out.refusals.append(_refusal(fqn, reason[:200]))
        return None
    fused = []
    for site in _sites(parent, graph):
        name = f"{fqn}.{site['node'].target}" if fqn else site["node"].target
        if "refuse" in site:
            out.refusals.append(_refusal(name, site["refuse"]))
        elif site["calls"] > 1:
            out.refusals.append(_refusal(name, "the norm module is called more than once"))
        elif has_hooks(site["norm"]) or has_hooks(parent):
            out.refusals.append(_refusal(name, "a hook is registered: it would see other values"))
        elif ctx.allows(site["norm"], name):
            fused.append(site)
    if not fused:
        return None
    for site in fused:
        _rewrite(site, parent, graph)
    graph.lint()
    rewritten = fx.GraphModule(parent, graph, class_name=f"Fused{type(parent).__name__}")
    for site in fused:
        rewritten.set_submodule(site["node"].target, _fused(site, parent))
    rewritten.train(parent.training)
    _keep_order(rewritten, parent)
    keys = set(parent.state_dict())
    if set(rewritten.state_dict()) != keys:
        out.refusals.append(_refusal(fqn, "the rewrite would change the state_dict's keys"))
        return None
    for site in fused:
        name = f"{fqn}.{site['node'].target}" if fqn else site["node"].target
        what = {"relu": "BatchNorm2d + ReLU", "gelu": "LayerNorm + GELU"}.get(
            site["kind"], "add + LayerNorm"
        )
        what = "BatchNorm2d + residual add + ReLU" if "residual" in site else what
        out.changes.append(
            Change(transform=ID, module=name, detail=f"{what} fused", undo=lambda: None)
        )
    return rewritten


def _parents(model: nn.Module) -> list[str]:
    """Names of the modules that call a BatchNorm2d or LayerNorm child, deepest first."""
    names = {
        fqn.rpartition(".")[0]
        for fqn, m in model.named_modules()
        if fqn and type(m) in (nn.BatchNorm2d, nn.LayerNorm)
    }
    return sorted(names, key=lambda n: -n.count(".") if n else 1)


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    for fqn in _parents(model):
        parent = model.get_submodule(fqn)
        if not ctx.allows(parent, fqn):
            continue
        before = len(out.changes)
        rewritten = _fuse_in(parent, fqn, ctx, out)
        if rewritten is None:
            continue
        if "forward" in parent.__dict__:  # fx traced the class's forward: it would be dropped
            del out.changes[before:]
            why = "its forward is replaced on the instance (autocast, a checkpoint): fx drops it"
            out.refusals.append(_refusal(fqn, why))
            continue
        if fqn:
            holder, name = parent_of(model, fqn)
            setattr(holder, name, rewritten)
            undo = lambda h=holder, n=name, p=parent: setattr(h, n, p)
        else:
            out.root = model = rewritten
            undo = lambda p=parent: p
        # one undo for the parent's rewrite, carried by its first change
        first = out.changes[before]
        out.changes[before] = Change(
            transform=ID, module=first.module, detail=first.detail, undo=undo
        )
    return out
