"""fuse-group-norm: group norms become gpushape's GroupNormAct (kernels/group_norm), and an
activation that is a group norm's only reader runs inside it.

PyTorch's eager GroupNorm takes its statistics with one thread block per (sample, group), so
few-group norms leave most SMs idle (on an H100 the probe measured a one-group norm at 0.13 of the
copy rate and a 32-group one at 0.20); gpushape's kernels split the pixels over the whole GPU and
run the activation in the norm's elementwise pass.

Three steps, each sharing the norm's Parameters (the same objects under the same names: the
state_dict, its keys and the optimizer's references are unchanged) and carrying its own undo:
1. timm's GroupNormAct and GroupNorm1Act (a group norm, `drop`, `act` in one module) become
   GroupNormAct(activation=act) where drop is nn.Identity and act is ReLU, SiLU, GELU (erf or
   tanh) or Hardswish; with act nn.Identity, the plain kernel.
2. In each module that calls a group norm (its parent), the data flow from torch.fx (the parent
   traced with its children as leaves): a group norm whose only user is one of those
   activations, directly or through a plain nn.Identity, becomes GroupNormAct(activation=...)
   and the activation's call goes (timm's ResNet-GN bottleneck: `bn1` then `act1`). Refused,
   with the reason, as fuse-norm-act refuses: a norm called more than once, hooks, a forward
   replaced on the instance, a rewrite that would change the state_dict's keys.
3. Every other group norm becomes GroupNormAct with no activation.
Matched by type: exactly nn.GroupNorm, timm's GroupNorm, GroupNorm1 and PoolFormerV2's
GroupNorm1NoBias (`models/_libraries.py`), whose forward is F.group_norm on the module's own
parameters; a subclass may compute something else and is left alone. The output differs from
PyTorch's only by rounding. Under torch.compile Inductor writes its own group-norm kernels: the
transform is not applied there.
"""

from __future__ import annotations

from torch import fx, nn

from ..kernels import GroupNormAct
from ..models.library import is_library_group_norm
from ._core import (
    Change,
    Outcome,
    Refusal,
    TransformContext,
    has_hooks,
    install,
    module_holders,
    register_transform,
    swap_each,
)
from ._norm_act_match import (
    BATCH_NORM_ACTS,
    activation,
    keep_order,
    module_activation,
    only_user,
    through_identity,
)
from ._norm_act_match import ChildrenAsLeaves as _ChildrenAsLeaves
from ._norm_act_match import callee as _callee
from ._norm_act_swaps import ACT_NAMES

ID = "fuse-group-norm"


def _refusal(fqn: str, reason: str) -> Refusal:
    return Refusal(transform=ID, module=fqn, reason=reason)


def _library_act(m: nn.Module) -> tuple[str | None, str | None]:
    """(activation, None) for timm's GroupNormAct / GroupNorm1Act, or (None, why not)."""
    if has_hooks(m) or has_hooks(m.drop) or has_hooks(m.act):
        return None, "a hook is registered: it would see other values"
    if type(m.drop) is not nn.Identity:
        return None, f"its drop ({type(m.drop).__name__}) runs between the norm and the activation"
    if type(m.act) is nn.Identity:
        return "none", None
    name = module_activation(m.act)
    if name not in BATCH_NORM_ACTS:
        why = f"its activation {type(m.act).__name__} is not one GroupNormAct runs"
        return None, f"{why} ({', '.join(BATCH_NORM_ACTS)})"
    return name, None


def _swap_library_norm_acts(model: nn.Module, ctx: TransformContext, out: Outcome) -> nn.Module:
    holders = module_holders(model)
    for fqn, m in list(model.named_modules()):
        if not is_library_group_norm(m, with_act=True) or not ctx.allows(m, fqn):
            continue
        name, reason = _library_act(m)
        if reason is None and len(holders[id(m)]) > 1:
            reason = "the module is held in more than one place"
        if reason is not None:
            out.refusals.append(_refusal(fqn, reason))
            continue
        model, undo = install(model, fqn, GroupNormAct.from_module(m, name), out)
        what = "" if name == "none" else f" + {ACT_NAMES[name]}"
        detail = f"{type(m).__name__} (GroupNorm{what}) on gpushape's kernels"
        out.changes.append(Change(transform=ID, module=fqn, detail=detail, undo=undo))
    return model


def _sites(parent: nn.Module, graph: fx.Graph) -> list[dict]:
    """Group-norm calls in `graph` whose only reader is an activation GroupNormAct runs."""
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    sites = []
    for node in graph.nodes:
        norm = _callee(node, parent) if node.op == "call_module" else None
        if norm is None or not is_library_group_norm(norm):
            continue
        user = only_user(node)
        through = through_identity(node, parent)
        after = only_user(through) if through is not None else None
        site = {"node": node, "norm": norm, "calls": calls[node.target]}
        if user is not None and activation(user, parent) in BATCH_NORM_ACTS:
            sites.append({**site, "act": user, "act_name": activation(user, parent)})
        elif after is not None and activation(after, parent) in BATCH_NORM_ACTS:
            name = activation(after, parent)
            sites.append({**site, "act": after, "act_name": name, "through": through})
    return sites


def _fuse_in(parent: nn.Module, fqn: str, ctx: TransformContext, out: Outcome):
    """The rewritten parent (a GraphModule) and its fused sites, or None."""
    try:
        graph = _ChildrenAsLeaves(parent).trace(parent)
    except Exception:  # not traceable: its norms are still swapped one by one (step 3)
        return None
    fused = []
    for site in _sites(parent, graph):
        name = f"{fqn}.{site['node'].target}" if fqn else site["node"].target
        if site["calls"] > 1:
            out.refusals.append(_refusal(name, "the norm module is called more than once"))
        elif has_hooks(site["norm"]) or has_hooks(parent):
            out.refusals.append(_refusal(name, "a hook is registered: it would see other values"))
        elif ctx.allows(site["norm"], name):
            fused.append(site)
    if not fused:
        return None
    for site in fused:
        site["act"].replace_all_uses_with(site.get("through", site["node"]))
        graph.erase_node(site["act"])
    graph.lint()
    rewritten = fx.GraphModule(parent, graph, class_name=f"Fused{type(parent).__name__}")
    for site in fused:
        new = GroupNormAct.from_module(site["norm"], site["act_name"])
        rewritten.set_submodule(site["node"].target, new)
    rewritten.train(parent.training)
    keep_order(rewritten, parent)
    if set(rewritten.state_dict()) != set(parent.state_dict()):
        out.refusals.append(_refusal(fqn, "the rewrite would change the state_dict's keys"))
        return None
    return rewritten, fused


def _parents(model: nn.Module) -> list[str]:
    """Names of the modules that hold a group norm GroupNormAct takes, deepest first."""
    names = {
        fqn.rpartition(".")[0]
        for fqn, m in model.named_modules()
        if fqn and is_library_group_norm(m)
    }
    return sorted(names, key=lambda n: -n.count(".") if n else 1)


def _fuse_activations(model: nn.Module, ctx: TransformContext, out: Outcome) -> nn.Module:
    for fqn in _parents(model):
        parent = model.get_submodule(fqn)
        if not ctx.allows(parent, fqn):
            continue
        found = _fuse_in(parent, fqn, ctx, out)
        if found is None:
            continue
        rewritten, fused = found
        if "forward" in parent.__dict__:  # fx traced the class's forward: it would be dropped
            why = "its forward is replaced on the instance (autocast, a checkpoint): fx drops it"
            out.refusals.append(_refusal(fqn, why))
            continue
        model, undo = install(model, fqn, rewritten, out)
        for i, site in enumerate(fused):
            name = f"{fqn}.{site['node'].target}" if fqn else site["node"].target
            detail = f"{type(site['norm']).__name__} + {ACT_NAMES[site['act_name']]} fused"
            done = undo if i == 0 else (lambda: None)  # one undo for the parent's rewrite
            out.changes.append(Change(transform=ID, module=name, detail=detail, undo=done))
    return model


def _build(module: nn.Module) -> tuple[nn.Module, str]:
    new = GroupNormAct.from_module(module)
    return new, f"{type(module).__name__} -> gpushape GroupNormAct: the SMs all take part"


@register_transform(ID, pays_under_compile=False)
def apply(model: nn.Module, ctx: TransformContext) -> Outcome:
    out = Outcome()
    model = _swap_library_norm_acts(model, ctx, out)
    model = _fuse_activations(model, ctx, out)
    rest = swap_each(model, ctx, ID, is_library_group_norm, _build)
    out.changes.extend(rest.changes)
    out.refusals.extend(rest.refusals)
    return out
